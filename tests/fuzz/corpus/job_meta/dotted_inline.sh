# /// ferry
# interpreter = 'sh'
# params.a = { type = "list", items = "float", default = [1, 2.5, inf], choices = [1.0, 2.5, inf, nan] }
# params.b.type = "bool"
# params.b.required = 1
# ///
