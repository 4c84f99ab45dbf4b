'use strict';
// Send messages with the official Producer, one after another, and print a JSON
// line per receipt.
//
// Spec (argv[2], JSON):
//   endpoints        "127.0.0.1:8081"
//   topic            every message goes to this topic
//   namespace        optional, default ""
//   startupTimeoutMs optional, default 15000
//   accessKey, accessSecret  optional: sign every request (sessionCredentials)
//   sslEnabled       optional: TLS (trusts GRPC_DEFAULT_SSL_ROOTS_FILE_PATH's roots)
//   messages         [{ body | bodyBase64, tag?, keys?, properties?, messageGroup?, delayMs?,
//                       priority?, liteTopic?,
//                       topic? (overrides the spec's topic for this message) }]
//
// Output lines:
//   {"event":"started"}
//   {"event":"sent","index":i,"messageId":...,"transactionId":...,"offset":n,"queueId":q,
//    "deliveryTimestampMs":t|null}
//   (queueId is the queue the client named in its request; client 1.0.8 only ever
//   picks queue 0 of a route, and the server chooses the real queue itself)
//   {"event":"send_error","index":i,"error":"..."}
//   {"event":"done","sent":n,"failed":m}
// Exit status 0 only when every message was sent.

const { Producer } = require('rocketmq-client-nodejs');
const {
  readSpec, emit, stderrLogger, errorText, withTimeout, runMain, connectionOptions,
} = require('./common');

function toMessageOptions(topic, m) {
  const options = {
    topic: m.topic ?? topic,
    body: m.bodyBase64 !== undefined ? Buffer.from(m.bodyBase64, 'base64') : Buffer.from(m.body ?? '', 'utf8'),
  };
  if (m.tag !== undefined) options.tag = m.tag;
  if (m.keys !== undefined) options.keys = m.keys;
  if (m.properties !== undefined) options.properties = new Map(Object.entries(m.properties));
  if (m.messageGroup !== undefined) options.messageGroup = m.messageGroup;
  if (m.priority !== undefined) options.priority = m.priority;
  if (m.liteTopic !== undefined) options.liteTopic = m.liteTopic;
  // Fix the delivery time here rather than passing `delay`, so the test knows the
  // exact timestamp the client put on the wire.
  if (m.delayMs !== undefined) options.deliveryTimestamp = new Date(Date.now() + m.delayMs);
  return options;
}

async function main() {
  const spec = readSpec();
  const producer = new Producer({
    endpoints: spec.endpoints,
    namespace: spec.namespace ?? '',
    topics: [ spec.topic ],
    logger: stderrLogger(),
    ...connectionOptions(spec),
  });
  await withTimeout(producer.startup(), spec.startupTimeoutMs ?? 15000, 'Producer.startup()');
  emit({ event: 'started' });

  let sent = 0;
  let failed = 0;
  for (const [ index, m ] of spec.messages.entries()) {
    const options = toMessageOptions(spec.topic, m);
    try {
      const receipt = await producer.send(options);
      sent++;
      emit({
        event: 'sent',
        index,
        messageId: receipt.messageId,
        transactionId: receipt.transactionId,
        offset: receipt.offset,
        queueId: receipt.messageQueue.queueId,
        deliveryTimestampMs: options.deliveryTimestamp ? options.deliveryTimestamp.getTime() : null,
      });
    } catch (err) {
      failed++;
      emit({ event: 'send_error', index, error: errorText(err) });
    }
  }
  emit({ event: 'done', sent, failed });
  await withTimeout(producer.shutdown(), 5000, 'Producer.shutdown()');
  return failed === 0 ? 0 : 1;
}

runMain(main);
