'use strict';
// Send delay messages with the official Producer and recall some of them with
// Producer.recallMessage(topic, receipt.recallHandle); print a JSON line per step.
//
// Spec (argv[2], JSON):
//   endpoints        "127.0.0.1:8081"
//   topic            every message goes to this topic
//   startupTimeoutMs optional, default 15000
//   messages         [{ body, delayMs, recall: bool, recallTwice?: bool }]
//   forgedHandle     optional: also recall with this handle (expected to fail)
//
// Output lines:
//   {"event":"started"}
//   {"event":"sent","index":i,"messageId":...,"recallHandle":...,"deliveryTimestampMs":t}
//   {"event":"recalled","index":i,"messageId":...}            (the RecallReceipt's id)
//   {"event":"recall_error","index":i|"forged","error":"..."}
//   {"event":"done"}

const { Producer } = require('rocketmq-client-nodejs');
const { readSpec, emit, stderrLogger, errorText, withTimeout, runMain } = require('./common');

async function recall(producer, topic, index, handle) {
  try {
    const receipt = await producer.recallMessage(topic, handle);
    emit({ event: 'recalled', index, messageId: receipt.messageId });
  } catch (err) {
    emit({ event: 'recall_error', index, error: errorText(err) });
  }
}

async function main() {
  const spec = readSpec();
  const producer = new Producer({
    endpoints: spec.endpoints,
    namespace: '',
    topics: [ spec.topic ],
    logger: stderrLogger(),
  });
  await withTimeout(producer.startup(), spec.startupTimeoutMs ?? 15000, 'Producer.startup()');
  emit({ event: 'started' });

  const receipts = [];
  for (const [ index, m ] of spec.messages.entries()) {
    const deliveryTimestamp = new Date(Date.now() + m.delayMs);
    const receipt = await producer.send({ topic: spec.topic, body: Buffer.from(m.body, 'utf8'), deliveryTimestamp });
    receipts.push(receipt);
    emit({
      event: 'sent',
      index,
      messageId: receipt.messageId,
      recallHandle: receipt.recallHandle ?? null,
      deliveryTimestampMs: deliveryTimestamp.getTime(),
    });
  }
  for (const [ index, m ] of spec.messages.entries()) {
    if (!m.recall) continue;
    await recall(producer, spec.topic, index, receipts[index].recallHandle);
    if (m.recallTwice) await recall(producer, spec.topic, index, receipts[index].recallHandle);
  }
  if (spec.forgedHandle !== undefined) await recall(producer, spec.topic, 'forged', spec.forgedHandle);
  emit({ event: 'done' });
  await withTimeout(producer.shutdown(), 5000, 'Producer.shutdown()');
  return 0;
}

runMain(main);
