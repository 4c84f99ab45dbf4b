'use strict';
// Consume with the official PushConsumer (its listener always succeeds) and print a
// JSON line per consumed message, until the test kills the script or the deadline
// passes. Several of these may run in one consumer group.
//
// Spec (argv[2], JSON):
//   endpoints, group, topic
//   filter            tag expression, default "*"
//   readyQueues       emit "ready" once the consumer receives from this many queues
//                     (one per assignment; a FIFO group is assigned every queue)
//   deadlineMs        give up after this long (default 30000)
//   startupTimeoutMs  default 15000
//
// Output lines:
//   {"event":"started"}
//   {"event":"ready","queues":n}
//   {"event":"consumed", messageId, body, messageGroup, properties, deliveryAttempt,
//    consumedAtMs}   (consumedAtMs: wall-clock ms with a fraction, comparable across
//                     processes on one machine; taken when the listener is called)
//   {"event":"done","consumed":n}

const { PushConsumer, ConsumeResult, FilterExpression } = require('rocketmq-client-nodejs');
const { readSpec, emit, stderrLogger, withTimeout, runMain } = require('./common');

function now() {
  return performance.timeOrigin + performance.now();
}

async function main() {
  const spec = readSpec();
  let consumed = 0;
  const consumer = new PushConsumer({
    endpoints: spec.endpoints,
    namespace: spec.namespace ?? '',
    consumerGroup: spec.group,
    subscriptions: new Map([ [ spec.topic, new FilterExpression(spec.filter ?? '*') ] ]),
    logger: stderrLogger(),
    messageListener: {
      consume(view) {
        consumed++;
        emit({
          event: 'consumed',
          messageId: view.messageId,
          body: view.body.toString('utf8'),
          messageGroup: view.messageGroup || null,
          properties: Object.fromEntries(view.properties),
          deliveryAttempt: view.deliveryAttempt ?? null,
          consumedAtMs: now(),
        });
        return ConsumeResult.SUCCESS;
      },
    },
  });
  await withTimeout(consumer.startup(), spec.startupTimeoutMs ?? 15000, 'PushConsumer.startup()');
  emit({ event: 'started' });

  const deadline = Date.now() + (spec.deadlineMs ?? 30000);
  let ready = spec.readyQueues === undefined;
  // Assignments arrive from the consumer's own scan (1 s after startup, then every 5 s).
  while (Date.now() < deadline) {
    if (!ready && consumer.getQueueSize() >= spec.readyQueues) {
      ready = true;
      emit({ event: 'ready', queues: consumer.getQueueSize() });
    }
    await new Promise(resolve => setTimeout(resolve, 50));
  }
  emit({ event: 'done', consumed });
  await withTimeout(consumer.shutdown(), 5000, 'PushConsumer.shutdown()');
  return 0;
}

runMain(main);
