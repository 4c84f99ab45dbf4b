'use strict';
// Transactional sends with the official Producer and its TransactionChecker, as in
// RocketMQ's TransactionProducer example: each half message is committed, rolled
// back or left open by the "local transaction"; the checker keeps a status per
// message and answers the server's checks from it.
//
// Spec (argv[2], JSON):
//   endpoints, topic
//   messages          [{ body, keys?, end: "commit"|"rollback"|"none",
//                        check: "commit"|"rollback"|"unknown" (the checker's answer) }]
//   deadlineMs        stay alive (answering checks) at most this long after sending
//                     (default 30000); the test kills the script when it has seen enough
//   startupTimeoutMs  default 15000
//   accessKey, accessSecret  optional: sign every request (sessionCredentials)
//   sslEnabled        optional: TLS (trusts GRPC_DEFAULT_SSL_ROOTS_FILE_PATH's roots)
//
// Output lines:
//   {"event":"started"}
//   {"event":"sent","index":i,"messageId":...,"transactionId":...}
//   {"event":"ended","index":i,"end":"commit"|"rollback"}
//   {"event":"checked","messageId":...,"body":...,"answer":"commit"|"rollback"|"unknown"}
//   {"event":"send_error","index":i,"error":"..."}
//   {"event":"waiting"}              every message sent and ended as told
// Exit status 0 when the deadline passes with every send done.

const { Producer } = require('rocketmq-client-nodejs');
const {
  readSpec, emit, stderrLogger, errorText, withTimeout, runMain, connectionOptions,
} = require('./common');

// apache.rocketmq.v2.TransactionResolution
const RESOLUTION = { unknown: 0, commit: 1, rollback: 2 };

async function main() {
  const spec = readSpec();
  const answers = new Map(); // messageId -> the checker's answer
  const checker = {
    async check(view) {
      const answer = answers.get(view.messageId) ?? 'unknown';
      emit({ event: 'checked', messageId: view.messageId, body: view.body.toString('utf8'), answer });
      return RESOLUTION[answer];
    },
  };
  const producer = new Producer({
    endpoints: spec.endpoints,
    topics: [ spec.topic ],
    checker,
    logger: stderrLogger(),
    ...connectionOptions(spec),
  });
  await withTimeout(producer.startup(), spec.startupTimeoutMs ?? 15000, 'Producer.startup()');
  emit({ event: 'started' });

  let failed = 0;
  for (const [ index, m ] of spec.messages.entries()) {
    try {
      const transaction = producer.beginTransaction();
      const options = { topic: spec.topic, body: Buffer.from(m.body, 'utf8') };
      if (m.keys !== undefined) options.keys = m.keys;
      const receipt = await producer.send(options, transaction);
      answers.set(receipt.messageId, m.check ?? 'unknown');
      emit({ event: 'sent', index, messageId: receipt.messageId, transactionId: receipt.transactionId });
      if (m.end === 'commit') {
        await transaction.commit();
        emit({ event: 'ended', index, end: 'commit' });
      } else if (m.end === 'rollback') {
        await transaction.rollback();
        emit({ event: 'ended', index, end: 'rollback' });
      }
    } catch (err) {
      failed++;
      emit({ event: 'send_error', index, error: errorText(err) });
    }
  }
  emit({ event: 'waiting' });
  await new Promise(resolve => setTimeout(resolve, spec.deadlineMs ?? 30000));
  await producer.shutdown();
  return failed === 0 ? 0 : 1;
}

runMain(main);
