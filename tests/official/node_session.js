#!/usr/bin/env node
// A long-lived official Node.js client (rocketmq-client-nodejs, from .node-client/ as installed
// by `make node-client`) driven by JSON lines, the Node twin of tests/official/python_session.py.
//
//   node tests/official/node_session.js '{"endpoint": "127.0.0.1:8081",
//       "role": "producer" | "simple", "topics": [...], "group": "...", "await_s": 2}'
//
// then one JSON command per stdin line; one JSON answer per command on stdout:
// {"ok": true, ...} or {"ok": false, "error": "<ErrorName>", "code": <int|null>, "message": "..."}.
// The first line is {"ok": true, "ready": true, "client_id": ...} once startup() returned (for a
// client with topics that means the server answered Telemetry with Settings), or ok: false.
'use strict';

const path = require('node:path');
const readline = require('node:readline');
const util = require('node:util');

const REPO = path.resolve(__dirname, '..', '..');
const CLIENT_DIR = process.env.POPMQ_NODE_CLIENT_DIR || path.join(REPO, '.node-client');
const CLIENT_PACKAGE = path.join(CLIENT_DIR, 'node_modules', 'rocketmq-client-nodejs');
const rocketmq = require(CLIENT_PACKAGE);
// The client takes and answers TransactionResolution values of its generated protobuf module.
const { TransactionResolution } = require(
  path.join(CLIENT_PACKAGE, 'proto', 'apache', 'rocketmq', 'v2', 'definition_pb'));

// The client's default logger writes to ~/logs; ours keeps its log on stderr with the test.
const stderrLogger = {
  info: (...args) => process.stderr.write(`INFO ${util.format(...args)}\n`),
  warn: (...args) => process.stderr.write(`WARN ${util.format(...args)}\n`),
  error: (...args) => process.stderr.write(`ERROR ${util.format(...args)}\n`),
  debug: () => {},
  close: () => {},
};

function emit(payload) {
  process.stdout.write(`${JSON.stringify(payload)}\n`);
}

function errorPayload(err) {
  const code = err && typeof err.code === 'number' ? err.code : (err && err.code) ?? null;
  return {
    ok: false,
    error: (err && (err.constructor?.name || err.name)) || 'Error',
    code,
    message: String(err && err.message ? err.message : err),
  };
}

const ms = date => (date instanceof Date ? date.getTime() : null);

function messageToJson(view) {
  const body = view.body || Buffer.alloc(0);
  return {
    message_id: view.messageId,
    topic: view.topic,
    body: body.toString('utf8'),
    body_len: body.length,
    tag: view.tag ?? null,
    keys: [ ...(view.keys || []) ].sort(),
    message_group: view.messageGroup || null,
    properties: Object.fromEntries(view.properties || []),
    delivery_attempt: view.deliveryAttempt ?? null,
    receipt_handle: view.receiptHandle,
    born_timestamp: ms(view.bornTimestamp),
    born_host: view.bornHost,
    delivery_timestamp: ms(view.deliveryTimestamp),
    transport_delivery_timestamp: ms(view.transportDeliveryTimestamp),
    offset: view.offset ?? null,
    corrupted: Boolean(view.corrupted),
    received_at_ms: Date.now(),
  };
}

function buildMessage(topic, spec) {
  const options = { topic: spec.topic || topic, body: Buffer.from(spec.body ?? '', 'utf8') };
  if (spec.tag) options.tag = spec.tag;
  if (spec.keys) options.keys = spec.keys;
  if (spec.group) options.messageGroup = spec.group;
  if (spec.delay_s) options.deliveryTimestamp = new Date(Date.now() + spec.delay_s * 1000);
  if (spec.properties) options.properties = new Map(Object.entries(spec.properties));
  return options;
}

class Session {
  constructor(config) {
    this.config = config;
    this.role = config.role;
    this.topics = config.topics || [];
    this.received = new Map(); // message id -> latest MessageView (for ack and the like)
    const base = {
      endpoints: config.endpoint,
      namespace: config.namespace || '',
      requestTimeout: config.request_timeout_ms || 3000,
      logger: stderrLogger,
      // TLS roots: grpc-js's defaults (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH / NODE_EXTRA_CA_CERTS).
      sslEnabled: config.tls === true,
    };
    if (config.ak) {
      base.sessionCredentials = { accessKey: config.ak, accessSecret: config.sk || '' };
    }
    if (this.role === 'producer' && config.transactional) {
      // Answers check-backs by message body (set_decisions: "COMMIT", "ROLLBACK", else
      // unknown) and records each check it was asked.
      this.decisions = new Map();
      this.checked = [];
      const checker = {
        check: async view => {
          const body = (view.body || Buffer.alloc(0)).toString('utf8');
          const decision = this.decisions.get(body) || 'UNKNOWN';
          this.checked.push({ body, message_id: view.messageId, topic: view.topic, decision });
          if (decision === 'COMMIT') return TransactionResolution.COMMIT;
          if (decision === 'ROLLBACK') return TransactionResolution.ROLLBACK;
          return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED;
        },
      };
      this.client = new rocketmq.Producer({ ...base, topics: this.topics, checker });
    } else if (this.role === 'producer') {
      this.client = new rocketmq.Producer({ ...base, topics: this.topics });
    } else if (this.role === 'simple') {
      const subscriptions = new Map(this.topics.map(t => [ t, config.filter || '*' ]));
      this.client = new rocketmq.SimpleConsumer({
        ...base,
        consumerGroup: config.group,
        subscriptions,
        awaitDuration: Math.round((config.await_s ?? 30) * 1000),
      });
    } else {
      throw new Error(`unknown role ${this.role}`);
    }
  }

  async start(timeoutMs) {
    // startup() waits for the server's Settings with no limit of its own.
    let timer;
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(
        `startup did not finish within ${timeoutMs} ms (no Telemetry settings?)`)), timeoutMs);
    });
    try {
      await Promise.race([ this.client.startup(), timeout ]);
    } finally {
      clearTimeout(timer);
    }
  }

  // -- ops -----------------------------------------------------------------------------------
  async op_send(cmd) {
    const results = [];
    const topic = cmd.topic || this.topics[0];
    for (const spec of cmd.messages) {
      const started = performance.now();
      try {
        const message = buildMessage(topic, spec);
        const receipt = await this.client.send(message);
        results.push({
          ok: true,
          message_id: receipt.messageId,
          offset: receipt.offset,
          queue_id: receipt.messageQueue?.queueId ?? null,
          elapsed_s: (performance.now() - started) / 1000,
          // the due time this session set (ms), for tests that check it came back unchanged
          delivery_timestamp: message.deliveryTimestamp ? message.deliveryTimestamp.getTime() : null,
        });
      } catch (err) {
        results.push(errorPayload(err));
      }
    }
    return { ok: true, results };
  }

  // One transactional message, then cmd.end: "commit", "rollback" or "none" (left open, for a
  // check-back).
  async op_tx_send(cmd) {
    const transaction = this.client.beginTransaction();
    const receipt = await this.client.send(
      buildMessage(cmd.topic || this.topics[0], cmd.message), transaction);
    const end = cmd.end || 'commit';
    if (end === 'commit') await transaction.commit();
    else if (end === 'rollback') await transaction.rollback();
    return { ok: true, message_id: receipt.messageId, transaction_id: receipt.transactionId };
  }

  async op_set_decisions(cmd) {
    for (const [ body, decision ] of Object.entries(cmd.decisions)) {
      this.decisions.set(body, decision);
    }
    return { ok: true };
  }

  // The check-backs seen so far; waits up to timeout_s for at least `count`.
  async op_checked(cmd) {
    const deadline = performance.now() + (cmd.timeout_s ?? 0) * 1000;
    while (this.checked.length < (cmd.count ?? 0) && performance.now() < deadline) {
      await new Promise(resolve => setTimeout(resolve, 50));
    }
    return { ok: true, checked: [ ...this.checked ] };
  }

  remember(views) {
    for (const view of views) this.received.set(view.messageId, view);
    return views.map(messageToJson);
  }

  async op_receive(cmd) {
    const started = performance.now();
    const views = await this.client.receive(cmd.max ?? 16, (cmd.invisible_s ?? 15) * 1000);
    return {
      ok: true,
      messages: this.remember(views),
      elapsed_s: (performance.now() - started) / 1000,
    };
  }

  // Receive until `count` messages arrived (acking them unless ack=false) or `timeout_s`.
  async op_receive_until(cmd) {
    const deadline = performance.now() + (cmd.timeout_s ?? 30) * 1000;
    const got = [];
    const errors = [];
    let calls = 0;
    let empties = 0;
    while (got.length < cmd.count && performance.now() < deadline) {
      calls += 1;
      let views;
      try {
        views = await this.client.receive(cmd.max ?? 16, (cmd.invisible_s ?? 15) * 1000);
      } catch (err) {
        errors.push(errorPayload(err));
        await new Promise(resolve => setTimeout(resolve, 200));
        continue;
      }
      if (views.length === 0) empties += 1;
      for (const view of views) {
        if (cmd.ack === false) continue;
        try {
          await this.client.ack(view);
        } catch (err) {
          errors.push(errorPayload(err));
        }
      }
      got.push(...this.remember(views));
    }
    return { ok: true, messages: got, calls, empties, errors };
  }

  async op_ack(cmd) {
    await this.client.ack(this.view(cmd.id));
    return { ok: true };
  }

  async op_change_invisible(cmd) {
    const view = this.view(cmd.id);
    const old = view.receiptHandle;
    try {
      await this.client.changeInvisibleDuration(view, cmd.invisible_s * 1000);
    } catch (err) {
      return { ...errorPayload(err), receipt_handle: view.receiptHandle };
    }
    return { ok: true, receipt_handle: view.receiptHandle, old_receipt_handle: old };
  }

  // Put back an older handle (to check that a replaced handle no longer works).
  async op_set_handle(cmd) {
    this.view(cmd.id).receiptHandle = cmd.receipt_handle;
    return { ok: true };
  }

  view(id) {
    const view = this.received.get(id);
    if (!view) throw new Error(`no received message with id ${id}`);
    return view;
  }

  async handle(cmd) {
    const op = this[`op_${cmd.op}`];
    if (typeof op !== 'function') {
      return { ok: false, error: 'UnknownOp', code: null, message: cmd.op };
    }
    try {
      return await op.call(this, cmd);
    } catch (err) {
      return { ...errorPayload(err), stack: String(err && err.stack).split('\n').slice(0, 4) };
    }
  }

  async shutdown() {
    try {
      await this.client.shutdown();
    } catch (err) {
      process.stderr.write(`shutdown failed: ${err && err.stack}\n`);
    }
  }
}

async function main() {
  const config = JSON.parse(process.argv[2]);
  let session;
  try {
    session = new Session(config);
    await session.start((config.start_timeout_s ?? 20) * 1000);
  } catch (err) {
    emit(errorPayload(err));
    return 1;
  }
  emit({ ok: true, ready: true, client_id: session.client.clientId });
  const lines = readline.createInterface({ input: process.stdin, terminal: false });
  try {
    for await (const line of lines) {
      if (!line.trim()) continue;
      const cmd = JSON.parse(line);
      if (cmd.op === 'shutdown') break;
      emit(await session.handle(cmd));
    }
  } finally {
    await session.shutdown();
    emit({ ok: true, closed: true });
  }
  return 0;
}

// gRPC channels and the client's timers keep the loop alive: exit explicitly when done.
main().then(code => process.exit(code), err => {
  process.stderr.write(`${err && err.stack}\n`);
  process.exit(2);
});
