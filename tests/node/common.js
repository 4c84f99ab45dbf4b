'use strict';
// Shared plumbing for the compatibility scripts: one JSON spec in, JSON lines out.
//
// Each script takes its whole job as one JSON argument (so the Python test decides
// every message and expectation) and prints one JSON object per line on stdout.
// The client's own log goes to stderr, where the test shows it when something fails.

const util = require('node:util');

function readSpec() {
  const raw = process.argv[2];
  if (!raw) {
    process.stderr.write(`usage: node ${process.argv[1]} '<json spec>'\n`);
    process.exit(2);
  }
  return JSON.parse(raw);
}

function emit(record) {
  process.stdout.write(JSON.stringify(record) + '\n');
}

// The client's default logger writes to ~/logs/rocketmq; a test wants it on stderr.
// HALFMOON_NODE_DEBUG=1 adds the info lines (startup, settings, routes).
function stderrLogger() {
  const verbose = process.env.HALFMOON_NODE_DEBUG === '1';
  const line = (level, args) => {
    const text = args.map(a => (a instanceof Error ? a.stack : a));
    process.stderr.write(`${new Date().toISOString()} ${level} ${util.format(...text)}\n`);
  };
  return {
    info: (...args) => verbose && line('INFO', args),
    debug: (...args) => verbose && line('DEBUG', args),
    warn: (...args) => line('WARN', args),
    error: (...args) => line('ERROR', args),
  };
}

function errorText(err) {
  if (!err) return null;
  const parts = [err.name || 'Error', err.message];
  if (err.code !== undefined) parts.push(`code=${err.code}`);
  if (err.cause) parts.push(`cause=${errorText(err.cause)}`);
  return parts.join(' ');
}

// Startup of the official client blocks until the server answers its Settings over
// the telemetry stream; a broken server would hang the script, so bound it.
async function withTimeout(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not finish within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([ promise, timeout ]);
  } finally {
    clearTimeout(timer);
  }
}

// The spec's accessKey/accessSecret (sign every request) and sslEnabled (TLS; the client
// trusts GRPC_DEFAULT_SSL_ROOTS_FILE_PATH's roots) as the clients' options.
// spec.clockSkewSeconds: this process's clock runs that far ahead (negative: behind), as
// on a machine with a wrong clock; the client stamps x-mq-date-time from it.
function skewClock(seconds) {
  const RealDate = Date;
  const skewMs = seconds * 1000;
  class SkewedDate extends RealDate {
    constructor(...args) {
      super(...(args.length ? args : [ RealDate.now() + skewMs ]));
    }
    static now() {
      return RealDate.now() + skewMs;
    }
  }
  globalThis.Date = SkewedDate;
}

function connectionOptions(spec) {
  if (spec.clockSkewSeconds) skewClock(spec.clockSkewSeconds);
  return {
    sslEnabled: spec.sslEnabled === true,
    sessionCredentials: spec.accessKey === undefined ? undefined
      : { accessKey: spec.accessKey, accessSecret: spec.accessSecret },
  };
}

// Make the process exit with a JSON error line instead of a bare stack.
function runMain(main) {
  main().then(
    code => process.exit(code ?? 0),
    err => {
      emit({ event: 'fatal', error: errorText(err) });
      process.stderr.write(`${err && err.stack ? err.stack : err}\n`);
      process.exit(1);
    });
}

module.exports = {
  readSpec, emit, stderrLogger, errorText, withTimeout, runMain, connectionOptions,
};
