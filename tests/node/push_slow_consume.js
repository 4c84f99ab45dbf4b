'use strict';
// Consume with the official PushConsumer (which receives with auto_renew) and a slow
// listener; print a JSON line per delivery and per finished listener call.
//
// Spec (argv[2], JSON):
//   endpoints, group, topic
//   expect            stop once this many distinct messages were consumed
//   listenerMs        how long the listener works on each message (default 0)
//   lingerMs          after reaching `expect`, keep running this long so that
//                     duplicate deliveries show up (default 0)
//   deadlineMs        give up after this long (default 30000)
//   startupTimeoutMs  default 15000
//
// Output lines:
//   {"event":"started"}
//   {"event":"received", messageId, body, deliveryAttempt, receivedAtMs}
//   {"event":"consumed", messageId, finishedAtMs}
//   {"event":"done","consumed":n,"deliveries":m,"timedOut":bool}
// The consumer is shut down (NotifyClientTermination) before "done".
// Exit status 0 only when `expect` messages were consumed.

const { PushConsumer, ConsumeResult, FilterExpression } = require('rocketmq-client-nodejs');
const { readSpec, emit, stderrLogger, withTimeout, runMain } = require('./common');

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

async function main() {
  const spec = readSpec();
  const listenerMs = spec.listenerMs ?? 0;
  const consumed = new Set();
  let deliveries = 0;
  const consumer = new PushConsumer({
    endpoints: spec.endpoints,
    namespace: spec.namespace ?? '',
    consumerGroup: spec.group,
    subscriptions: new Map([ [ spec.topic, new FilterExpression('*') ] ]),
    messageListener: {
      async consume(view) {
        deliveries += 1;
        emit({
          event: 'received',
          messageId: view.messageId,
          body: view.body.toString(),
          deliveryAttempt: view.deliveryAttempt ?? null,
          receivedAtMs: Date.now(),
        });
        await sleep(listenerMs);
        consumed.add(view.messageId);
        emit({ event: 'consumed', messageId: view.messageId, finishedAtMs: Date.now() });
        return ConsumeResult.SUCCESS;
      },
    },
    logger: stderrLogger(),
  });
  await withTimeout(consumer.startup(), spec.startupTimeoutMs ?? 15000, 'PushConsumer.startup()');
  emit({ event: 'started' });

  const deadline = Date.now() + (spec.deadlineMs ?? 30000);
  while (consumed.size < spec.expect && Date.now() < deadline) await sleep(50);
  const timedOut = consumed.size < spec.expect;
  if (!timedOut) await sleep(spec.lingerMs ?? 0);
  await consumer.shutdown();
  emit({ event: 'done', consumed: consumed.size, deliveries, timedOut });
  return timedOut ? 1 : 0;
}

runMain(main);
