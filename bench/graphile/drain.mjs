// drain.mjs: graphile-worker draining N preloaded no-op jobs, the peer of taskpush-bench's
// drain (bench/graphile.sh runs both in one run). Prints one JSON line.
//
//   node drain.mjs --url postgres://... --jobs N [--procs P] [--concurrency C]
//                  [--local-queue L] [--batch-delay-ms D]
//
// The parent preloads N jobs (identifier "noop", payload {"i": k}, k = 1..N) in one
// statement, then forks P worker processes of C concurrent jobs each, with graphile-worker's
// own batching (a local queue of L jobs per process and batched completion) as its docs
// advise for many small jobs. The window runs from the first job's start in any process
// (so that node's and the pools' start-up is not counted against the peer) to the moment
// the job table is empty, every completion committed. Verification: every k ran exactly
// once (each process reports its count and the sum and sum of squares of k; the totals
// must equal N, N(N+1)/2 and N(N+1)(2N+1)/6), no job is left, none failed.
import { fork } from "node:child_process";
import { parseArgs } from "node:util";
import pg from "pg";
import { Logger, run, runMigrations } from "graphile-worker";

// Per-job INFO lines would cost the peer more than its jobs do: log nothing.
const quiet = new Logger(() => () => {});

const { values: opt } = parseArgs({
  options: {
    url: { type: "string" },
    jobs: { type: "string", default: "100000" },
    procs: { type: "string", default: "4" },
    concurrency: { type: "string", default: "24" },
    "local-queue": { type: "string", default: "500" },
    "batch-delay-ms": { type: "string", default: "0" },
    child: { type: "boolean", default: false },
  },
});

function positive(name, max) {
  const v = Number(opt[name]);
  if (!Number.isInteger(v) || v < 0 || v > max) {
    console.error(`drain.mjs: --${name} wants an integer in 0..${max}`);
    process.exit(2);
  }
  return v;
}

const now = () => Number(process.hrtime.bigint()) / 1e9; // CLOCK_MONOTONIC: one clock for all processes
const n = positive("jobs", 10_000_000);
const procs = positive("procs", 64);
const concurrency = positive("concurrency", 1000);
const localQueue = positive("local-queue", 100_000);
const batchDelay = positive("batch-delay-ms", 10_000);
if (!opt.url) {
  console.error("drain.mjs: --url is required");
  process.exit(2);
}

if (opt.child) {
  // A worker process: starts when every process has loaded (so that the window does not
  // hold node's start-up of the later ones), runs until the parent says stop, and reports
  // what its handlers saw.
  let count = 0, sum = 0n, sumSq = 0n, first = null;
  const go = new Promise((resolve) => process.once("message", resolve));
  process.send({ loaded: true });
  await go;
  const runner = await run({
    connectionString: opt.url,
    concurrency,
    noHandleSignals: true,
    pollInterval: 1000,
    logger: quiet,
    preset: {
      worker: {
        localQueue: localQueue > 0 ? { size: localQueue } : undefined,
        completeJobBatchDelay: batchDelay,
        failJobBatchDelay: batchDelay,
      },
    },
    taskList: {
      noop: async (payload) => {
        if (first === null) first = now();
        const i = BigInt(payload.i);
        count++;
        sum += i;
        sumSq += i * i;
      },
    },
  });
  const report = () =>
    process.send({ count, sum: sum.toString(), sumSq: sumSq.toString(), first });
  const timer = setInterval(report, 50);
  process.on("message", async (m) => {
    if (m === "stop") {
      clearInterval(timer);
      await runner.stop();
      report();
      process.send({ stopped: true });
      process.disconnect();
    }
  });
} else {
  const db = new pg.Client({ connectionString: opt.url });
  await db.connect();
  await runMigrations({ connectionString: opt.url, logger: quiet });
  await db.query("DELETE FROM graphile_worker._private_jobs");
  const t_load = now();
  await db.query(
    `SELECT graphile_worker.add_jobs(array(
       SELECT json_populate_record(null::graphile_worker.job_spec,
                json_build_object('identifier', 'noop', 'payload', json_build_object('i', k)))
       FROM generate_series(1, $1::int) k))`,
    [n],
  );
  const loadSeconds = now() - t_load;
  const commits = async () =>
    Number((await db.query(
      "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")).rows[0].xact_commit);
  const c0 = await commits();

  const kids = [];
  const seen = new Array(procs).fill(null);
  const stopped = [];
  let loaded = 0;
  for (let p = 0; p < procs; p++) {
    const kid = fork(new URL(import.meta.url).pathname, [...process.argv.slice(2), "--child"]);
    kid.on("message", (m) => {
      if (m.stopped) stopped.push(p);
      else if (m.loaded) loaded++;
      else seen[p] = m;
    });
    kid.on("exit", (code, signal) => {
      if (code !== 0) {
        console.error(`drain.mjs: worker process ${p} ended (${signal ?? "status " + code})`);
        process.exit(1);
      }
    });
    kids.push(kid);
  }
  const loadDeadline = now() + 60;
  while (loaded < procs) {
    if (now() > loadDeadline) {
      console.error(`drain.mjs: ${procs - loaded} worker processes did not load within 60 s`);
      process.exit(1);
    }
    await new Promise((r) => setTimeout(r, 5));
  }
  for (const kid of kids) kid.send("go");
  // The table is empty when every job succeeded and its completion committed.
  const deadline = now() + 600;
  for (;;) {
    const left = Number((await db.query(
      "SELECT count(*) AS c FROM graphile_worker._private_jobs")).rows[0].c);
    if (left === 0) break;
    if (now() > deadline) {
      console.error(`drain.mjs: ${left} jobs left after 600 s`);
      break;
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  const t_end = now();
  const c1 = await commits();
  for (const kid of kids) kid.send("stop");
  while (stopped.length < procs && now() < t_end + 30)
    await new Promise((r) => setTimeout(r, 20));

  let count = 0, sum = 0n, sumSq = 0n, first = Infinity;
  for (const s of seen) {
    if (!s) continue;
    count += s.count;
    sum += BigInt(s.sum);
    sumSq += BigInt(s.sumSq);
    if (s.first !== null && s.first < first) first = s.first;
  }
  const N = BigInt(n);
  const left = Number((await db.query(
    "SELECT count(*) AS c FROM graphile_worker._private_jobs")).rows[0].c);
  const verified = count === n && sum === (N * (N + 1n)) / 2n &&
    sumSq === (N * (N + 1n) * (2n * N + 1n)) / 6n && left === 0;
  const seconds = t_end - first;
  const version = (await db.query("SHOW server_version")).rows[0].server_version;
  await db.end();
  console.log(JSON.stringify({
    kind: "run", design: "graphile-worker", k: procs * concurrency, procs, concurrency,
    local_queue: localQueue, batch_delay_ms: batchDelay, n, done: count,
    seconds, tasks_per_s: seconds > 0 ? count / seconds : 0,
    commits_per_task: (c1 - c0) / n, preload_s: loadSeconds,
    server: `PostgreSQL ${version}`, verified,
  }));
  process.exit(verified ? 0 : 1);
}
