// The load of `bench/store.pl throughput`: a mock provider and the
// clients that drive the module, in one Node process; the clients of
// acknowledged inputs in a second one.  No packages: Node's own http.
//
//   node store-load.mjs load NGINX_PORT MOCK_PORT SECONDS CONVERSATIONS
//                            CALLS ACK_RATE WARMUP BACKLOG [TURN_RATE]
//   node store-load.mjs fill NGINX_PORT MOCK_PORT SECONDS CONVERSATIONS
//                            CALLS BACKLOG
//
// The mock speaks OpenAI Chat Completions SSE (the whole reply in one
// write).  A message "load ..." gets CALLS calls of the tool `echo` in
// one reply, then, once their results are back, the text "done"; a
// message "ack ..." gets the text "ok" at once.  CONVERSATIONS clients
// each run turns back to back, a new conversation per turn (the mock's
// last reply of a turn starts the client's next), none started while
// more than BACKLOG events wait for the store (read from /metrics every
// 50 ms): the writer always has work, the zone is not filled with the
// events it cannot write yet.  After WARMUP
// seconds, for SECONDS seconds, a second process sends ACK_RATE
// messages a second to new conversations, on a fixed schedule whatever
// the answers, and times each POST to its 202.  Every second the store's
// counters are read from /metrics.  The result is one line of JSON.
// With TURN_RATE, the clients start at most that many turns a second
// between them, evenly spaced: a load below what the machine can run.
//
// With STORE_RT=1 in the environment the second process runs SCHED_FIFO
// (chrt: root or CAP_SYS_NICE), as bench/store.pl makes nginx's workers.
//
// fill: the same turns for SECONDS, but no client waits for its 202 (the
// store is locked by another process meanwhile); then the store's
// counters, with the events that wait.

import http from 'node:http';
import { execFileSync, fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const [mode, ...args] = process.argv.slice(2);

const agent = new http.Agent({ keepAlive: true, maxSockets: 1024 });

// a request's or a response's body, whole

function drain(stream) {
    return new Promise((resolve) => {
        const parts = [];
        stream.on('data', (d) => parts.push(d));
        stream.on('end', () => resolve(Buffer.concat(parts).toString()));
    });
}

// an answer, and the ms from the request to its end; status 0: no answer

function request(port, method, path, body) {
    const start = process.hrtime.bigint();
    const headers = body ? { 'Content-Type': 'application/json',
                             'Content-Length': Buffer.byteLength(body) }
                         : {};

    return new Promise((resolve) => {
        const req = http.request({ host: '127.0.0.1', port, method, path,
                                   agent, headers }, async (res) => {
            const text = await drain(res);
            const ms = Number(process.hrtime.bigint() - start) / 1e6;
            resolve({ status: res.statusCode, body: text, ms });
        });

        req.on('error', (e) => resolve({ status: 0, body: String(e),
                                         ms: 0 }));
        req.end(body);
    });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// a bound that does not keep the process alive
const bound = (ms) => new Promise((r) => setTimeout(r, ms).unref());

function pct(v, p) {
    if (v.length === 0) {
        return null;
    }

    const s = [...v].sort((a, b) => a - b);
    return s[Math.min(s.length - 1, Math.ceil(p * s.length) - 1)];
}


// the mock provider

const waiting = new Map();
let served = 0;

function sse(head, choices) {
    return 'data: ' + JSON.stringify({ ...head, choices }) + '\n\n';
}

function reply(res, body, calls) {
    const req = JSON.parse(body);
    const msgs = req.messages || [];
    const last = msgs[msgs.length - 1] || {};
    const user = msgs.filter((m) => m.role === 'user').pop() || {};
    const text = typeof user.content === 'string' ? user.content : '';
    const head = { id: 'chatcmpl-mock', object: 'chat.completion.chunk',
                   created: Math.floor(Date.now() / 1000),
                   model: req.model || 'gpt-mock' };
    const choice = (delta, finish = null) => sse(head, [{
        index: 0, delta, logprobs: null, finish_reason: finish }]);
    let out;

    served++;

    if (last.role === 'tool' || !text.startsWith('load ')) {
        out = choice({ role: 'assistant', content: '' })
              + choice({ content: last.role === 'tool' ? 'done' : 'ok' })
              + choice({}, 'stop');

        if (last.role === 'tool') {
            const cid = text.slice(5);
            const done = waiting.get(cid);

            if (done) {
                waiting.delete(cid);
                setImmediate(done);
            }
        }

    } else {
        const tc = [];

        for (let i = 0; i < calls; i++) {
            tc.push({ index: i, id: 'c' + i, type: 'function',
                      function: { name: 'echo', arguments: '{}' } });
        }

        out = choice({ role: 'assistant', content: null, tool_calls: tc })
              + choice({}, 'tool_calls');
    }

    res.writeHead(200, { 'Content-Type': 'text/event-stream' });
    res.end(out + 'data: [DONE]\n\n');
}

function mock(port, calls) {
    const server = http.createServer(async (req, res) => {
        reply(res, await drain(req), calls);
    });

    server.keepAliveTimeout = 60000;

    return new Promise((r) => server.listen(port, '127.0.0.1',
                                            () => r(server)));
}


// the store's counters

async function metrics(port) {
    const r = await request(port, 'GET', '/metrics');
    const v = (name) => {
        const m = r.body.match(new RegExp('^' + name + ' (\\d+)', 'm'));
        return m ? Number(m[1]) : null;
    };

    return { t: Date.now(), written: v('agent_store_batch_events_sum'),
             batches: v('agent_store_batch_events_count'),
             lag: v('agent_store_lag_events'),
             errors: v('agent_store_errors_total') };
}


// the clients of acknowledged inputs: a fixed schedule, a new
// conversation each

async function ack(port, rate, seconds) {
    const lat = [];
    const bad = {};
    const pending = [];
    const start = Date.now();
    const n = Math.round(rate * seconds);

    for (let i = 0; i < n; i++) {
        const due = start + (i * 1000) / rate;
        const wait = due - Date.now();

        if (wait > 0) {
            await sleep(wait);
        }

        pending.push(request(port, 'POST', `/c/ack-${process.pid}-${i}/`
                                           + 'messages',
                             '{"content":"ack"}').then((r) => {
            if (r.status === 202) {
                lat.push(r.ms);
            } else {
                bad[r.status] = (bad[r.status] || 0) + 1;
            }
        }));
    }

    await Promise.all(pending);

    return { sent: n, acked: lat.length, refused: bad,
             p50: pct(lat, 0.5), p90: pct(lat, 0.9), p99: pct(lat, 0.99),
             max: pct(lat, 1) };
}


// CONVERSATIONS clients running turns back to back, none started while
// more than BACKLOG events wait; with wait, a client waits for its 202
// (a refusal counted in refused) before it waits for the turn's end

function turns(port, conversations, backlog, wait, rate) {
    const run = { running: true, turns: 0, refused: {} };
    let full = false;
    let next = Date.now();

    // with rate, a turn's start waits for its slot
    const slot = async () => {
        if (!rate) {
            return;
        }

        const now = Date.now();
        const at = Math.max(now, next);

        next = at + 1000 / rate;

        if (at > now) {
            await sleep(at - now);
        }
    };

    const watch = (async () => {
        while (run.running) {
            full = (await metrics(port)).lag > backlog;
            await sleep(50);
        }
    })();

    const client = async (c) => {
        for (let i = 0; run.running; i++) {
            const cid = `load-${c}-${i}`;

            while (full && run.running) {
                await sleep(5);
            }

            await slot();

            const done = new Promise((r) => waiting.set(cid, r));
            const post = request(port, 'POST', `/c/${cid}/messages`,
                                 `{"content":"load ${cid}"}`);
            const r = wait ? await post : { status: 202 };

            if (r.status !== 202) {
                run.refused[r.status] = (run.refused[r.status] || 0) + 1;
                waiting.delete(cid);
                await sleep(100);
                continue;
            }

            await Promise.race([done, bound(30000)]);
            run.turns++;
        }
    };

    const clients = [watch];

    for (let c = 0; c < conversations; c++) {
        clients.push(client(c));
    }

    run.stop = () => {
        run.running = false;
        return Promise.all(clients);
    };

    return run;
}


async function load(a) {
    const [port, mport, seconds, conversations, calls, rate, warmup,
           backlog, turnRate] = a.map(Number);
    const server = await mock(mport, calls);
    const samples = [];
    const run = turns(port, conversations, backlog, true, turnRate || 0);

    await sleep(warmup * 1000);

    const acks = rate > 0
        ? new Promise((resolve) => {
            const p = fork(fileURLToPath(import.meta.url),
                           ['ack', port, rate, seconds]);
            p.on('message', resolve);
        })
        : Promise.resolve(null);

    const t0 = run.turns;

    for (let s = 0; s <= seconds; s++) {
        samples.push(await metrics(port));

        if (s < seconds) {
            await sleep(1000 - (Date.now() - samples[s].t));
        }
    }

    const t1 = run.turns;
    const stop = Date.now();
    const ackres = await acks;

    await run.stop();

    // how long the store takes to write what is left
    let end = await metrics(port);

    while (end.lag > 0 && Date.now() - stop < 60000) {
        await sleep(10);
        end = await metrics(port);
    }

    const first = samples[0];
    const last = samples[samples.length - 1];
    const secs = (last.t - first.t) / 1000;

    process.stdout.write(JSON.stringify({
        seconds: secs,
        turns: t1 - t0,
        written: last.written - first.written,
        per_second: Math.round((last.written - first.written) / secs),
        batches: last.batches - first.batches,
        lag: samples.map((s) => s.lag),
        written_each_second: samples.slice(1).map((s, i) =>
            s.written - samples[i].written),
        drained_ms: end.t - stop,
        errors: end.errors,
        refused: run.refused,
        served,
        ack: ackres,
    }) + '\n');

    server.close();
    agent.destroy();
}


// the store is locked: turns for SECONDS, then what waits

async function fill(a) {
    const [port, mport, seconds, conversations, calls, backlog] =
        a.map(Number);
    const server = await mock(mport, calls);
    const run = turns(port, conversations, backlog, false, 0);

    await sleep(seconds * 1000);
    await run.stop();

    process.stdout.write(JSON.stringify({
        turns: run.turns, ...(await metrics(port)) }) + '\n');

    server.close();
    agent.destroy();
}


if (mode === 'ack') {
    const [port, rate, seconds] = args.map(Number);

    if (process.env.STORE_RT === '1') {
        execFileSync('chrt', ['-f', '-p', '10', String(process.pid)]);
    }

    ack(port, rate, seconds).then((r) => {
        process.send(r);
        agent.destroy();
        process.disconnect();
    });

} else if (mode === 'fill') {
    fill(args);

} else {
    load(args);
}
