'use strict';
// Consume lite topics with the official LitePushConsumer and print a JSON line per delivery.
//
// Spec (argv[2], JSON):
//   endpoints, group, bindTopic
//   liteTopics        lite topics to subscribe to (subscribeLite each)
//   expect            stop once this many deliveries were consumed
//   deadlineMs        give up after this long (default 20000)
//   lingerMs          after `expect` deliveries, keep running this long (default 0), so
//                     the test can act meanwhile (delete a lite topic) and extra
//                     deliveries show up
//   startupTimeoutMs  default 15000
//
// Output lines:
//   {"event":"started","quota":n,"maxLiteTopicSize":m}
//   {"event":"subscribed","liteTopic":name}
//   {"event":"subscribe_error","liteTopic":name,"error":"..."}
//   {"event":"received","body":...,"liteTopic":...,"topic":...,"deliveryAttempt":n}
//   {"event":"lite_topics","liteTopics":[...]}   the client's own set, at the end
//   {"event":"done","received":n,"timedOut":bool}
// Exit status 0 only when `expect` deliveries arrived.

const { LitePushConsumerBuilder, ConsumeResult } = require('rocketmq-client-nodejs');
const { readSpec, emit, stderrLogger, errorText, withTimeout, runMain } = require('./common');

function sleep(ms) {
  return new Promise(resolve => setTimeout(resolve, ms));
}

async function main() {
  const spec = readSpec();
  const deadline = Date.now() + (spec.deadlineMs ?? 20000);
  let received = 0;
  const listener = {
    consume(view) {
      received++;
      emit({
        event: 'received',
        body: view.body.toString('utf8'),
        liteTopic: view.liteTopic ?? null,
        topic: view.topic,
        deliveryAttempt: view.deliveryAttempt ?? null,
      });
      return ConsumeResult.SUCCESS;
    },
  };
  const consumer = await withTimeout(
    new LitePushConsumerBuilder()
      .setClientConfiguration({ endpoints: spec.endpoints, logger: stderrLogger() })
      .setConsumerGroup(spec.group)
      .bindTopic(spec.bindTopic)
      .setMessageListener(listener)
      .build(),
    spec.startupTimeoutMs ?? 15000,
    'LitePushConsumer build/startup',
  );
  const manager = consumer.liteSubscriptionManager;
  // Settings arrive on the telemetry stream; the quota is known once they did.
  while (manager.liteSubscriptionQuota === 100 && Date.now() < deadline) await sleep(50);
  emit({ event: 'started', quota: manager.liteSubscriptionQuota, maxLiteTopicSize: manager.maxLiteTopicSize });
  for (const liteTopic of spec.liteTopics) {
    try {
      await consumer.subscribeLite(liteTopic);
      emit({ event: 'subscribed', liteTopic });
    } catch (err) {
      emit({ event: 'subscribe_error', liteTopic, error: errorText(err) });
    }
  }
  while (received < spec.expect && Date.now() < deadline) await sleep(50);
  const ok = received >= spec.expect;
  if (ok) await sleep(spec.lingerMs ?? 0);
  emit({ event: 'lite_topics', liteTopics: [ ...manager.getLiteTopicSet() ].sort() });
  emit({ event: 'done', received, timedOut: !ok });
  // A receive long poll in flight holds shutdown() until the server answers it (up to
  // its long-polling timeout): give it a moment, then exit anyway.
  await Promise.race([ consumer.shutdown(), sleep(2000) ]);
  return ok ? 0 : 1;
}

runMain(main);
