'use strict';
// Receive and acknowledge with the official SimpleConsumer until `expect` distinct
// messages are acknowledged or the deadline passes; print a JSON line per delivery.
//
// Spec (argv[2], JSON):
//   endpoints, group, topic
//   filter            tag expression ("*", "A || B") or SQL92 text; default "*"
//   filterType        "tag" (default) or "sql"
//   expect            stop once this many distinct messages are acknowledged
//   deadlineMs        give up after this long (default 20000)
//   lingerMs          after reaching `expect`, keep receiving this long so that
//                     duplicates or extra deliveries show up (default 0)
//   awaitDurationMs   long-polling timeout per receive (default 1000)
//   invisibleMs       invisible duration asked at receive (default 10000)
//   batchSize         max messages per receive (default 16)
//   retryProperty     a user property name: a message whose property is "true" is
//                     not acknowledged on its first delivery; its invisible duration
//                     is changed to retryInvisibleMs instead (default 1000), so it
//                     must come back with a higher delivery attempt
//   startupTimeoutMs  default 15000
//   accessKey, accessSecret  optional: sign every request (sessionCredentials)
//   sslEnabled        optional: TLS (trusts GRPC_DEFAULT_SSL_ROOTS_FILE_PATH's roots)
//
// Output lines:
//   {"event":"started"}
//   {"event":"received", messageId, topic, tag, keys, properties, messageGroup,
//    bodyBase64, deliveryAttempt, deliveryTimestampMs, bornTimestampMs,
//    receivedAtMs, corrupted, offset, priority, action: "ack"|"change_invisible", error}
//   {"event":"receive_error","error":"..."}
//   {"event":"done","acked":n,"deliveries":m,"timedOut":bool}
// Exit status 0 only when `expect` messages were acknowledged.

const { SimpleConsumer, FilterExpression } = require('rocketmq-client-nodejs');
const {
  readSpec, emit, stderrLogger, errorText, withTimeout, runMain, connectionOptions,
} = require('./common');

// apache.rocketmq.v2.FilterType: TAG = 1, SQL = 2
const FILTER_TYPES = { tag: 1, sql: 2 };

function describe(view, receivedAtMs) {
  return {
    event: 'received',
    messageId: view.messageId,
    topic: view.topic,
    tag: view.tag ?? null,
    keys: view.keys,
    properties: Object.fromEntries(view.properties),
    messageGroup: view.messageGroup || null,
    bodyBase64: view.body.toString('base64'),
    deliveryAttempt: view.deliveryAttempt ?? null,
    deliveryTimestampMs: view.deliveryTimestamp ? view.deliveryTimestamp.getTime() : null,
    bornTimestampMs: view.bornTimestamp ? view.bornTimestamp.getTime() : null,
    receivedAtMs,
    corrupted: view.corrupted === true,
    offset: view.offset ?? null,
    priority: view.priority ?? null,
  };
}

async function main() {
  const spec = readSpec();
  const filterType = FILTER_TYPES[spec.filterType ?? 'tag'];
  if (!filterType) throw new Error(`unknown filterType ${spec.filterType}`);
  const consumer = new SimpleConsumer({
    endpoints: spec.endpoints,
    namespace: spec.namespace ?? '',
    consumerGroup: spec.group,
    subscriptions: new Map([ [ spec.topic, new FilterExpression(spec.filter ?? '*', filterType) ] ]),
    awaitDuration: spec.awaitDurationMs ?? 1000,
    logger: stderrLogger(),
    ...connectionOptions(spec),
  });
  await withTimeout(consumer.startup(), spec.startupTimeoutMs ?? 15000, 'SimpleConsumer.startup()');
  emit({ event: 'started' });

  const expect = spec.expect;
  const deadline = Date.now() + (spec.deadlineMs ?? 20000);
  const invisibleMs = spec.invisibleMs ?? 10000;
  const retryInvisibleMs = spec.retryInvisibleMs ?? 1000;
  const acked = new Set();
  const postponed = new Set();
  let deliveries = 0;
  let lingerUntil = null;

  while (Date.now() < deadline && (lingerUntil === null || Date.now() < lingerUntil)) {
    let views;
    try {
      views = await consumer.receive(spec.batchSize ?? 16, invisibleMs);
    } catch (err) {
      emit({ event: 'receive_error', error: errorText(err) });
      // A broken receive should not spin: wait a little before the next attempt.
      await new Promise(resolve => setTimeout(resolve, 200));
      continue;
    }
    const receivedAtMs = Date.now();
    for (const view of views) {
      deliveries++;
      const record = describe(view, receivedAtMs);
      const retry = spec.retryProperty && view.properties.get(spec.retryProperty) === 'true' &&
        !postponed.has(view.messageId);
      try {
        if (retry) {
          record.action = 'change_invisible';
          await consumer.changeInvisibleDuration(view, retryInvisibleMs);
          postponed.add(view.messageId);
        } else {
          record.action = 'ack';
          await consumer.ack(view);
          acked.add(view.messageId);
        }
        record.error = null;
      } catch (err) {
        record.error = errorText(err);
      }
      emit(record);
    }
    if (lingerUntil === null && acked.size >= expect) {
      lingerUntil = Date.now() + (spec.lingerMs ?? 0);
    }
  }
  const timedOut = acked.size < expect;
  emit({ event: 'done', acked: acked.size, deliveries, timedOut });
  await withTimeout(consumer.shutdown(), 5000, 'SimpleConsumer.shutdown()');
  return timedOut ? 1 : 0;
}

runMain(main);
