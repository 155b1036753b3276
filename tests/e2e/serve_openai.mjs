// tests/e2e/serve_openai.mjs — `epyq serve` driven by the official `openai` npm client (run by
// tools_serve_openai.sh, which installs the package and starts the server). Prints a transcript
// of every exchange; exits 1 on the first broken expectation.
import OpenAI from 'openai';

const base = process.env.EPYQ_URL, model = process.env.EPYQ_MODEL, serverPid = Number(process.env.EPYQ_PID);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'sekret', maxRetries: 0, timeout: 60000 });
let fails = 0;
const ok = (c, what) => { console.log(`${c ? 'ok' : 'FAIL'}: ${what}`); if (!c) fails++; };
const show = (dir, obj) => console.log(`${dir} ${JSON.stringify(obj).slice(0, 400)}`);
const msgs = [{ role: 'user', content: 'Hi there' }];

async function streamText(params) {
  show('>', { ...params, stream: true });
  const s = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = '', reasoning = '', finish = null, usage = null, n = 0;
  for await (const c of s) {
    n++;
    if (c.usage) usage = c.usage;
    const ch = c.choices[0];
    if (!ch) continue;
    text += ch.delta.content ?? '';
    reasoning += ch.delta.reasoning_content ?? '';
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  show('<', { chunks: n, reasoning_content: reasoning, content: text, finish_reason: finish, usage });
  return { text, reasoning, finish, usage };
}

async function main() {
  const list = await client.models.list();
  show('< models', list.data);
  ok(list.data.some((m) => m.id === model), `models.list() has ${model}`);

  for (const sampling of [{ temperature: 0 }, { temperature: 0.8, seed: 7 }]) {
    const p = { model, messages: msgs, max_tokens: 20, ...sampling };
    show('>', p);
    const r = await client.chat.completions.create(p);
    show('<', r);
    const m = r.choices[0].message;
    ok(r.object === 'chat.completion' && r.usage.completion_tokens === 20 && r.choices[0].finish_reason === 'length',
       `non-streaming chat (${JSON.stringify(sampling)})`);
    const s = await streamText(p);
    ok(s.text === (m.content ?? '') && s.reasoning === (m.reasoning_content ?? ''), `streamed text = non-streamed (${JSON.stringify(sampling)})`);
    ok(s.usage && s.usage.completion_tokens === 20 && s.finish === 'length', 'stream usage and finish_reason');
  }

  const cp = { model, prompt: 'Once upon a time', max_tokens: 8, temperature: 0 };
  show('>', cp);
  const c = await client.completions.create(cp);
  show('<', c);
  ok(c.object === 'text_completion' && typeof c.choices[0].text === 'string' && c.usage.completion_tokens <= 8, 'completions.create');

  const many = await Promise.all([...Array(16).keys()].map((i) =>
    client.chat.completions.create({ model, messages: msgs, max_tokens: 12, seed: i, temperature: 0.7, stream: true })
      .then(async (s) => { let n = 0, fin = null; for await (const ch of s) { n++; if (ch.choices[0]?.finish_reason) fin = ch.choices[0].finish_reason; } return fin; })));
  ok(many.every((f) => f === 'length' || f === 'stop'), `16 concurrent streams finished: ${many.join(',')}`);

  // Abort a stream after its first chunk; the server cancels it; healthy requests follow.
  const ac = new AbortController();
  const s = await client.chat.completions.create({ model, messages: msgs, max_tokens: 60000, ignore_eos: true, stream: true },
                                                 { signal: ac.signal });
  let got = 0;
  try { for await (const ch of s) { if (++got === 2) ac.abort(); } } catch (e) { show('< abort', { name: e.name }); }
  // The server notices the closed socket on its next write or poll; under ASan on a busy host that
  // can take a while, so wait (up to 30 s) for the whole end state rather than its first sign.
  let metrics = '', cancelled = 0;
  const settled = () => cancelled >= 1 && /^epyq_requests_running 0$/m.test(metrics) && /^epyq_kv_bytes_in_use 0$/m.test(metrics);
  for (let i = 0; i < 300; i++) {
    metrics = await (await fetch(`${base}/metrics`)).text();
    cancelled = Number((metrics.match(/^epyq_requests_cancelled_total (\d+)$/m) || [])[1]);
    if (settled()) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  ok(settled(), `aborted stream cancelled on the server (cancelled_total ${cancelled}, running ${(metrics.match(/^epyq_requests_running (\d+)$/m) || [])[1]})`);
  const after = await client.chat.completions.create({ model, messages: msgs, max_tokens: 3 });
  ok(after.choices[0].message.role === 'assistant', 'healthy request after the abort');

  // Refused input: the client raises BadRequestError carrying the field.
  for (const [extra, param] of [[{ n: 2 }, 'n'], [{ temperature: 'hot' }, 'temperature'],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: {} } } }, 'response_format'],
    [{ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'http://x/y.png' } }] }] }, 'messages[0].content[0].image_url']]) {
    try {
      await client.chat.completions.create({ model, messages: msgs, max_tokens: 2, ...extra });
      ok(false, `${param} refused`);
    } catch (e) {
      show('< error', { status: e.status, error: e.error });
      ok(e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === param, `${param} refused with 400 naming it`);
    }
  }
  try {
    await new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong', maxRetries: 0 }).models.list();
    ok(false, 'wrong key refused');
  } catch (e) { ok(e instanceof OpenAI.AuthenticationError, 'wrong API key: AuthenticationError (401)'); }

  // SIGTERM during a stream: the stream still completes, the server exits (checked by the shell).
  const p = client.chat.completions.create({ model, messages: msgs, max_tokens: 400, ignore_eos: true, stream: true });
  const st = await p;
  let n = 0, fin = null;
  for await (const ch of st) {
    if (++n === 3) { process.kill(serverPid, 'SIGTERM'); console.log('> SIGTERM to the server'); }
    if (ch.choices[0]?.finish_reason) fin = ch.choices[0].finish_reason;
  }
  show('<', { chunks: n, finish_reason: fin });
  ok(fin === 'length' && n > 3, 'stream in flight at SIGTERM completed');
  try {
    await client.chat.completions.create({ model, messages: msgs, max_tokens: 2 });
    ok(false, 'no new requests after SIGTERM');
  } catch (e) { ok(e instanceof OpenAI.APIConnectionError || e.status === 503, `new request after SIGTERM refused (${e.constructor.name})`); }
}

main().then(() => { console.log(fails ? `${fails} failed` : 'all passed'); process.exit(fails ? 1 : 0); },
            (e) => { console.log(`FAIL: ${e.stack || e}`); process.exit(1); });
