// Drives `ferry mcp` through the official MCP TypeScript SDK client (stdio transport), one
// scenario per run, for the Python tests in this directory.
//
//   node mcp_client.mjs SCENARIO.json
//
// SCENARIO: {"command": "/path/ferry", "args": [...], "env": {...}, "steps": [STEP, ...]}
// Prints one JSON object: what initialize returned, each step's outcome, every message the
// server sent, the SDK's errors and the server's stderr.
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import {
  CallToolResultSchema,
  CreateTaskResultSchema,
  LoggingMessageNotificationSchema,
} from "@modelcontextprotocol/sdk/types.js";

const scenario = JSON.parse(readFileSync(process.argv[2], "utf8"));
const received = [];
const logs = [];
const errors = [];
let stderr = "";
let cancelOn = null; // {text, controller}: abort the running call when a line has `text`

const transport = new StdioClientTransport({
  command: scenario.command,
  args: scenario.args,
  env: { ...process.env, ...(scenario.env || {}) },
  cwd: scenario.cwd, // the directory the client starts the server in (default: the client's)
  stderr: "pipe",
});
transport.stderr.on("data", (chunk) => {
  stderr += chunk.toString();
});
// Every message the server sends, as the SDK parsed it (a line that is not JSON-RPC would
// surface as an error below instead).
const start = transport.start.bind(transport);
transport.start = async () => {
  const deliver = transport.onmessage;
  transport.onmessage = (message, extra) => {
    received.push(message);
    deliver(message, extra);
  };
  return start();
};

const client = new Client({ name: "ferry-mcp-test", version: "1.2.3" });
client.onerror = (error) => errors.push(String(error));
client.setNotificationHandler(LoggingMessageNotificationSchema, (notification) => {
  logs.push(notification.params);
  const line = notification.params?.data?.line;
  if (cancelOn && typeof line === "string" && line.includes(cancelOn.text)) {
    cancelOn.controller.abort("the test cancels this call");
    cancelOn = null;
  }
});

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function failure(error) {
  return { error: { code: error?.code ?? null, message: String(error?.message ?? error) } };
}

// The run id of step `index`'s result (a call with detach: true): its first run's.
function runIdOf(steps, index) {
  return steps[index]?.result?.structuredContent?.runs?.[0]?.run_id;
}

const textOf = (result) => (result?.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("");

// A call (its `run` the run of step `runFromStep`, or the task of step `taskFromStep`); with `untilText`, made again (up to `tries` times, 300 ms apart) until its text has it.
async function call(step, done) {
  const run = step.runFromStep === undefined ? taskIdOf(done, step.taskFromStep) : runIdOf(done, step.runFromStep);
  const args = run === undefined ? step.arguments : { ...step.arguments, run };
  let outcome;
  for (let i = 0; i < (step.tries ?? 1); i++) {
    if (i > 0) await sleep(300);
    outcome = await callOnce({ ...step, arguments: args });
    if (!step.untilText || textOf(outcome.result).includes(step.untilText)) break;
  }
  return outcome;
}

async function callOnce(step) {
  const progress = [];
  const controller = new AbortController();
  if (step.cancelOnLine) {
    cancelOn = { text: step.cancelOnLine, controller };
  }
  const logsBefore = logs.length;
  const options = { signal: controller.signal, timeout: step.timeoutMs ?? 120000 };
  if (step.progress) {
    options.onprogress = (p) => progress.push(p);
    options.resetTimeoutOnProgress = true;
  }
  let outcome;
  try {
    outcome = { result: await client.callTool({ name: step.name, arguments: step.arguments }, undefined, options) };
  } catch (error) {
    outcome = failure(error);
  }
  return { ...outcome, progress, logs: logs.slice(logsBefore) };
}

// MCP tasks, through the SDK's experimental tasks API: a tool called as a task (its
// CreateTaskResult), and tasks/get (again, up to `tries` times, 300 ms apart, until its status is
// `untilStatus`), tasks/result, tasks/cancel and tasks/list of the task step `taskFromStep` made
// (or of the task `taskId` names: one an earlier server started, say).
const taskIdOf = (steps, index) => steps[index]?.result?.task?.taskId;

async function taskStep(step, done) {
  const tasks = client.experimental.tasks;
  const id = step.taskId ?? taskIdOf(done, step.taskFromStep);
  switch (step.op) {
    case "callTask": {
      const request = { method: "tools/call", params: { name: step.name, arguments: step.arguments } };
      return { result: await client.request(request, CreateTaskResultSchema, { task: step.task ?? { ttl: 60000 } }) };
    }
    case "getTask": {
      let result;
      for (let i = 0; i < (step.tries ?? 1); i++) {
        if (i > 0) await sleep(300);
        result = await tasks.getTask(id);
        if (!step.untilStatus || result.status === step.untilStatus) break;
      }
      return { result };
    }
    case "taskResult":
      return { result: await tasks.getTaskResult(id, CallToolResultSchema, { timeout: 120000 }) };
    case "cancelTask":
      return { result: await tasks.cancelTask(id) };
    default:
      return { result: await tasks.listTasks() };
  }
}

// Polls resources/list until a run of `job` on `target` with `status` is listed (bounded).
async function waitRun(step) {
  const title = `${step.job} on ${step.target}: ${step.status}`;
  for (let i = 0; i < (step.tries ?? 60); i++) {
    const listed = await client.listResources();
    const found = listed.resources.find((r) => r.title === title);
    if (found) {
      return { resource: found };
    }
    await sleep(500);
  }
  return { error: { message: `no run titled '${title}' appeared` } };
}

// The first resource_link of step `index`'s result (whose uri holds `match`, when given).
function linkOf(steps, index, match) {
  const content = steps[index]?.result?.content ?? [];
  return content.find((c) => c.type === "resource_link" && (!match || c.uri.includes(match)))?.uri;
}

async function runStep(step, done) {
  switch (step.op) {
    case "listTools":
      return { result: await client.listTools() };
    case "call":
      return call(step, done);
    case "ping":
      if (step.delayMs) await sleep(step.delayMs);
      return { result: await client.ping() };
    case "setLevel":
      return { result: await client.setLoggingLevel(step.level) };
    case "listResources":
      return { result: await client.listResources() };
    case "readResource":
      return {
        result: await client.readResource({ uri: step.uri ?? linkOf(done, step.fromStep, step.match) }),
      };
    case "waitRun":
      return waitRun(step);
    case "callTask":
    case "getTask":
    case "taskResult":
    case "cancelTask":
    case "listTasks":
      return taskStep(step, done);
    case "run": // a command of the test's between two steps, the connection kept open
      return { output: execFileSync(step.argv[0], step.argv.slice(1), { encoding: "utf8" }) };
    case "parallel": {
      // Sub-steps at once; `order` says in which order they finished.
      const order = [];
      const results = await Promise.all(
        step.steps.map((sub, i) =>
          runStep(sub, done).then((r) => {
            order.push(i);
            return r;
          }),
        ),
      );
      return { results, order };
    }
    default:
      throw new Error(`unknown step ${step.op}`);
  }
}

const output = { steps: [] };
try {
  await client.connect(transport);
  output.serverVersion = client.getServerVersion();
  output.capabilities = client.getServerCapabilities();
  output.instructions = client.getInstructions();
  output.protocolVersion = received.find((m) => m.id !== undefined && m.result?.protocolVersion)?.result.protocolVersion;
  for (const step of scenario.steps) {
    let outcome;
    try {
      outcome = await runStep(step, output.steps);
    } catch (error) {
      outcome = failure(error);
    }
    output.steps.push(outcome);
  }
} catch (error) {
  output.fatal = String(error?.stack ?? error);
} finally {
  await client.close();
}
output.received = received;
output.errors = errors;
output.stderr = stderr;
process.stdout.write(JSON.stringify(output) + "\n");
