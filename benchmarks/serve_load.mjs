// benchmarks/serve_load.mjs — a bounded load test of a running `epyq serve`: N requests at
// concurrency C (alternating chat streaming / chat non-streaming / completions), with Node's
// built-in fetch (no packages). Prints requests/s, latency p50/p90/p99/max, time to first
// token of the streams, tokens/s, errors and hung connections (a request past --timeout),
// the server's RSS after the first tenth and at the end (stable memory = no growth between the
// two), as a table and with --json as one JSON line.
//   node benchmarks/serve_load.mjs --url http://127.0.0.1:8080 --pid PID [-n 200] [-c 32]
//        [--max-tokens 32] [--timeout 120] [--json]
import { readFileSync } from 'node:fs';

const a = process.argv.slice(2), arg = (k, d) => { const i = a.indexOf(k); return i >= 0 ? a[i + 1] : d; };
const url = arg('--url', 'http://127.0.0.1:8080'), pid = Number(arg('--pid', 0));
const N = Number(arg('-n', 200)), C = Number(arg('-c', 32)), maxTokens = Number(arg('--max-tokens', 32));
const timeoutS = Number(arg('--timeout', 120)), json = a.includes('--json');
const model = (await (await fetch(`${url}/v1/models`)).json()).data[0].id;

const rss = () => {
  if (!pid) return 0;
  const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/^VmRSS:\s+(\d+) kB/m);
  return m ? Number(m[1]) / 1024 : 0;
};

async function one(i) {
  const kind = i % 3; // 0 chat stream, 1 chat, 2 completions
  const body = kind === 2
    ? { model, prompt: `Request ${i}: once upon a time`, max_tokens: maxTokens, seed: i, temperature: 0.7, ignore_eos: true }
    : { model, messages: [{ role: 'user', content: `Request ${i}: tell me a story` }], max_tokens: maxTokens, seed: i,
        temperature: 0.7, ignore_eos: true, stream: kind === 0, stream_options: kind === 0 ? { include_usage: true } : undefined };
  const t0 = performance.now();
  const ctl = AbortSignal.timeout(timeoutS * 1000);
  let ttft = null, tokens = 0;
  try {
    const r = await fetch(`${url}${kind === 2 ? '/v1/completions' : '/v1/chat/completions'}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body), signal: ctl });
    if (r.status !== 200) return { ok: false, why: `HTTP ${r.status}`, ms: performance.now() - t0 };
    if (kind === 0) {
      const dec = new TextDecoder();
      let buf = '', done = false;
      for await (const part of r.body) {
        if (ttft === null) ttft = performance.now() - t0;
        buf += dec.decode(part, { stream: true });
        let k;
        while ((k = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, k); buf = buf.slice(k + 2);
          if (ev === 'data: [DONE]') { done = true; continue; }
          const c = JSON.parse(ev.slice(6));
          if (c.error) return { ok: false, why: c.error.message, ms: performance.now() - t0 };
          if (c.usage) tokens = c.usage.completion_tokens;
        }
      }
      if (!done) return { ok: false, why: 'stream ended without [DONE]', ms: performance.now() - t0 };
    } else {
      tokens = (await r.json()).usage.completion_tokens;
    }
    return { ok: tokens === maxTokens, why: tokens === maxTokens ? '' : `${tokens} tokens`, ms: performance.now() - t0, ttft, tokens };
  } catch (e) {
    return { ok: false, why: e.name === 'TimeoutError' ? 'hung' : String(e), ms: performance.now() - t0 };
  }
}

const res = [];
let next = 0, rssEarly = 0;
const t0 = performance.now();
const rss0 = rss();
await Promise.all([...Array(C)].map(async () => {
  while (next < N) {
    const i = next++;
    res.push(await one(i));
    if (res.length === Math.ceil(N / 10)) rssEarly = rss();
  }
}));
const wall = (performance.now() - t0) / 1000, rssEnd = rss();
const ms = res.map((r) => r.ms).sort((x, y) => x - y), q = (p) => ms[Math.min(ms.length - 1, Math.floor(p * ms.length))];
const tt = res.filter((r) => r.ttft !== null && r.ttft !== undefined).map((r) => r.ttft).sort((x, y) => x - y);
const errors = res.filter((r) => !r.ok), hung = errors.filter((r) => r.why === 'hung').length;
const tokens = res.reduce((s, r) => s + (r.tokens || 0), 0);
const out = { requests: N, concurrency: C, max_tokens: maxTokens, seconds: +wall.toFixed(2), rps: +(N / wall).toFixed(2),
  p50_ms: +q(0.5).toFixed(1), p90_ms: +q(0.9).toFixed(1), p99_ms: +q(0.99).toFixed(1), max_ms: +ms[ms.length - 1].toFixed(1),
  ttft_p50_ms: tt.length ? +tt[Math.floor(tt.length / 2)].toFixed(1) : null, tokens_per_s: +(tokens / wall).toFixed(1),
  errors: errors.length, hung, rss_start_mib: +rss0.toFixed(1), rss_after_10pct_mib: +rssEarly.toFixed(1), rss_end_mib: +rssEnd.toFixed(1),
  first_errors: errors.slice(0, 3).map((e) => e.why) };
if (json) console.log(JSON.stringify(out));
else {
  console.log('| requests | conc | req/s | p50 ms | p90 ms | p99 ms | max ms | TTFT p50 | tok/s | errors | hung | RSS start / 10% / end MiB |');
  console.log('|---|---|---|---|---|---|---|---|---|---|---|---|');
  console.log(`| ${N} | ${C} | ${out.rps} | ${out.p50_ms} | ${out.p90_ms} | ${out.p99_ms} | ${out.max_ms} | ${out.ttft_p50_ms} | ${out.tokens_per_s} | ` +
              `${out.errors} | ${hung} | ${out.rss_start_mib} / ${out.rss_after_10pct_mib} / ${out.rss_end_mib} |`);
  if (errors.length) console.log('errors:', out.first_errors);
}
process.exit(errors.length ? 1 : 0);
