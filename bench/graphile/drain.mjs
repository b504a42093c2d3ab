// drain.mjs: graphile-worker, the peer of taskpush-bench (bench/graphile.sh runs both in
// one run). Prints one JSON line.
//
//   node drain.mjs --url postgres://... [--procs P] [--concurrency C]
//                  [--local-queue L] [--batch-delay-ms D]
//                  --jobs N                                 the drain
//                  --mixed --seconds S [--payload-bytes B] [--producers-per-kind Q]
//                                                           the mixed workload
//
// Workers: P processes of C concurrent jobs, each with graphile-worker's own batching (a
// local queue of L jobs and batched completion), as its docs advise for many small jobs.
//
// drain: N jobs (identifier "noop", payload {"i": k}, k = 1..N) preloaded in one
// statement; the window runs from the first job's start in any process (so that node's
// and the pools' start-up is not counted against the peer) to the moment the job table
// is empty, every completion committed.
//
// mixed: the workers start on an empty table, then for S seconds 4 x Q producers add jobs
// while they run, as taskpush-bench's mixed mode does with its four kinds; graphile-worker
// has one way in (SQL), so its SUBMIT producers are SQL ones too: 2Q add one job per call
// (graphile_worker.add_job), 2Q add 100 per call (add_jobs), each on its own connection,
// as many services would; a payload holds
// its enqueue time and B bytes of padding. (graphile-worker keeps no results: a handler's
// result is dropped, so the peer pays nothing for taskpush's result bytes.) Reported: the
// jobs completed within the window per second, each kind's call latency, and the enqueue-
// to-start latency; after the window, the rest is drained before verification.
//
// Verification, both: every k ran exactly once (each process reports its count and the
// sum and sum of squares of the k its handlers saw; the totals must equal those of 1..N),
// and no job is left.
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
    mixed: { type: "boolean", default: false },
    seconds: { type: "string", default: "10" },
    "payload-bytes": { type: "string", default: "1024" },
    "producers-per-kind": { type: "string", default: "2" },
    child: { type: "boolean", default: false },
  },
});

function bounded(name, min, max) {
  const v = Number(opt[name]);
  if (!Number.isInteger(v) || v < min || v > max) {
    console.error(`drain.mjs: --${name} wants an integer in ${min}..${max}`);
    process.exit(2);
  }
  return v;
}

const now = () => Number(process.hrtime.bigint()) / 1e9; // CLOCK_MONOTONIC: one clock for all processes
const n = bounded("jobs", 1, 10_000_000);
const procs = bounded("procs", 1, 64);
const concurrency = bounded("concurrency", 1, 1000);
const localQueue = bounded("local-queue", 0, 100_000);
const batchDelay = bounded("batch-delay-ms", 0, 10_000);
const seconds = bounded("seconds", 1, 3600);
const payloadBytes = bounded("payload-bytes", 0, 1 << 20);
const perKind = bounded("producers-per-kind", 1, 64);
if (!opt.url) {
  console.error("drain.mjs: --url is required");
  process.exit(2);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Percentile p (0..100) of a sorted array, in ms from seconds.
function pct(sorted, p) {
  if (sorted.length === 0) return null;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i] * 1000;
}

if (opt.child) {
  // A worker process: starts when every process has loaded (so that the window does not
  // hold node's start-up of the later ones), runs until the parent says stop, and reports
  // what its handlers saw: counts and sums, the first start, and (mixed) the enqueue-to-
  // start latencies of the jobs since the last report.
  let count = 0, sum = 0n, sumSq = 0n, first = null;
  let lat = [];
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
        const t = now();
        if (first === null) first = t;
        if (typeof payload.t === "number") lat.push(t - payload.t);
        const i = BigInt(payload.i);
        count++;
        sum += i;
        sumSq += i * i;
      },
    },
  });
  const report = () => {
    process.send({ count, sum: sum.toString(), sumSq: sumSq.toString(), first, lat });
    lat = [];
  };
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
  // Each round starts on a clean table, as taskpush's starts on a fresh one: the dead
  // rows of the last round's jobs would slow this one's scans.
  await db.query("VACUUM (ANALYZE) graphile_worker._private_jobs");
  const commits = async () =>
    Number((await db.query(
      "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")).rows[0].xact_commit);
  const jobsLeft = async () =>
    Number((await db.query("SELECT count(*) AS c FROM graphile_worker._private_jobs")).rows[0].c);

  let preloadSeconds = null;
  if (!opt.mixed) {
    const t = now();
    await db.query(
      `SELECT graphile_worker.add_jobs(array(
         SELECT json_populate_record(null::graphile_worker.job_spec,
                  json_build_object('identifier', 'noop', 'payload', json_build_object('i', k)))
         FROM generate_series(1, $1::int) k))`,
      [n],
    );
    preloadSeconds = now() - t;
  }

  // The worker processes, and what each last reported.
  const kids = [];
  const seen = new Array(procs).fill(null);
  const e2e = [];
  let loaded = 0;
  const stopped = [];
  for (let p = 0; p < procs; p++) {
    const kid = fork(new URL(import.meta.url).pathname, [...process.argv.slice(2), "--child"]);
    kid.on("message", (m) => {
      if (m.stopped) stopped.push(p);
      else if (m.loaded) loaded++;
      else {
        seen[p] = m;
        for (const x of m.lat) e2e.push(x);
      }
    });
    kid.on("exit", (code, signal) => {
      if (code !== 0) {
        console.error(`drain.mjs: worker process ${p} ended (${signal ?? "status " + code})`);
        process.exit(1);
      }
    });
    kids.push(kid);
  }
  const handled = () => seen.reduce((a, s) => a + (s ? s.count : 0), 0);
  const loadDeadline = now() + 60;
  while (loaded < procs) {
    if (now() > loadDeadline) {
      console.error(`drain.mjs: ${procs - loaded} worker processes did not load within 60 s`);
      process.exit(1);
    }
    await sleep(5);
  }
  const c0 = await commits();
  for (const kid of kids) kid.send("go");

  const out = {
    kind: "run", design: "graphile-worker", mode: opt.mixed ? "mixed" : "drain",
    k: procs * concurrency, procs, concurrency, local_queue: localQueue, batch_delay_ms: batchDelay,
  };
  let total = n, windowStart = null, windowEnd = null, windowDone = 0;
  if (opt.mixed) {
    // Wait until every process is running (its first report), then produce for S seconds.
    while (seen.some((s) => s === null)) await sleep(5);
    const pad = "x".repeat(payloadBytes);
    let next = 0;
    const ack = { single: [], batch100: [] };
    const producers = [];
    const end = now() + seconds;
    windowStart = now();
    const done0 = handled();
    for (const kindName of ["single", "batch100"]) {
      for (let q = 0; q < perKind * 2; q++) {
        producers.push((async () => {
          const c = new pg.Client({ connectionString: opt.url });
          await c.connect();
          while (now() < end) {
            const t = now();
            if (kindName === "single") {
              const i = ++next;
              await c.query("SELECT graphile_worker.add_job('noop', $1::json)",
                [JSON.stringify({ i, t, pad })]);
            } else {
              const specs = [];
              for (let j = 0; j < 100; j++) specs.push(JSON.stringify({ i: ++next, t, pad }));
              await c.query(
                `SELECT graphile_worker.add_jobs(array(
                   SELECT json_populate_record(null::graphile_worker.job_spec,
                            json_build_object('identifier', 'noop', 'payload', p::json))
                   FROM unnest($1::text[]) p))`, [specs]);
            }
            ack[kindName].push(now() - t);
          }
          await c.end();
        })());
      }
    }
    await Promise.all(producers);
    windowEnd = now();
    windowDone = handled() - done0;
    total = next;
    for (const k of Object.keys(ack)) {
      const a = ack[k].sort((x, y) => x - y);
      out[`ack_${k}_p50_ms`] = pct(a, 50);
      out[`ack_${k}_p99_ms`] = pct(a, 99);
      out[`ack_${k}_p999_ms`] = pct(a, 99.9);
    }
    out.payload_bytes = payloadBytes;
    out.producers = perKind * 4;
    out.seconds_window = windowEnd - windowStart;
  }

  // Every completion committed: the table is empty.
  const deadline = now() + 600;
  for (;;) {
    const left = await jobsLeft();
    if (left === 0) break;
    if (now() > deadline) {
      console.error(`drain.mjs: ${left} jobs left after 600 s`);
      break;
    }
    await sleep(20);
  }
  const tEnd = now();
  const c1 = await commits();
  for (const kid of kids) kid.send("stop");
  while (stopped.length < procs && now() < tEnd + 30) await sleep(20);

  let count = 0, sum = 0n, sumSq = 0n, first = Infinity;
  for (const s of seen) {
    if (!s) continue;
    count += s.count;
    sum += BigInt(s.sum);
    sumSq += BigInt(s.sumSq);
    if (s.first !== null && s.first < first) first = s.first;
  }
  const N = BigInt(total);
  const left = await jobsLeft();
  const verified = count === total && sum === (N * (N + 1n)) / 2n &&
    sumSq === (N * (N + 1n) * (2n * N + 1n)) / 6n && left === 0;
  const version = (await db.query("SHOW server_version")).rows[0].server_version;
  await db.end();
  if (opt.mixed) {
    const l = e2e.sort((x, y) => x - y);
    out.tasks_per_s = windowDone / (windowEnd - windowStart);
    out.start_p50_ms = pct(l, 50);
    out.start_p99_ms = pct(l, 99);
    out.start_p999_ms = pct(l, 99.9);
    out.tail_s = tEnd - windowEnd;
  } else {
    out.seconds = tEnd - first;
    out.tasks_per_s = out.seconds > 0 ? count / out.seconds : 0;
    out.preload_s = preloadSeconds;
  }
  Object.assign(out, {
    n: total, done: count, commits_per_task: total ? (c1 - c0) / total : 0,
    server: `PostgreSQL ${version}`, verified,
  });
  console.log(JSON.stringify(out));
  process.exit(verified ? 0 : 1);
}
