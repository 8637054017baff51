// The peers' workload against each server in turn, the same mock and the
// same load generator for all; prints one table of the servers' CPU per
// turn and writes it (with the machine) into bench/README.md.
//
//   bench/peers/run [conversations] [concurrency]
//
// Environment: PEERS_SERVERS (a comma-separated subset of the names
// below), PEERS_PACINGS (trickle,burst), PEERS_MODULE (the module's .so),
// PEERS_NGINX (/usr/sbin/nginx), PEERS_WARMUP (conversations before the
// measure), PEERS_PROFILE=1 (perf record of the module's worker, the top
// of each profile printed), PEERS_THREADS=1 (the module's worker's CPU
// per turn split between its event loop and its thread pool, from each
// thread's schedstat, on stderr), PEERS_DELTA_INTERVAL
// (agent_delta_interval of the module's rows but the "defaults" ones,
// which set none, and the "agent_delta_interval 0" ones; 20ms), PEERS_STORE_FLUSH (their agent_store flush=, 10ms; 0: none) and
// PEERS_COMMIT_DELAY (their agent_store commit_delay=, 2ms; 0: none),
// PEERS_ROUNDS (1: every server run so many times, in turn, its figure
// their median).  Only a run of every server and both pacings,
// unprofiled, writes its tables: CPU per turn, and a turn's end (p50
// and p99 of the time from the client's POST to the end of its
// stream).
//
// One turn: the client sends the chat (useChat's body); the model asks
// for get_weather with its arguments in 4 chunks; the tool runs; the
// model streams 200 tokens; the client reads the response to its end.
// Four turns per conversation.  The servers run on CPU 1, this process
// (the load generator) and the mock on CPU 0 (run pins itself there).
// CPU per turn is utime + stime from /proc/PID/stat of every process of
// the server, over the measured conversations, after a warm-up.

import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '../..');

const conversations = Number(process.argv[2] || 100);
const concurrency = Number(process.argv[3] || 4);
const warmup = Number(process.env.PEERS_WARMUP
                      || Math.max(10, 2 * concurrency));
const TURNS = 4;
const TOKENS = 200;

const nginx = process.env.PEERS_NGINX || '/usr/sbin/nginx';
const module = process.env.PEERS_MODULE
    || path.join(repo, 'build/nginx/objs/ngx_http_agent_module.so');
const profile = process.env.PEERS_PROFILE === '1';
const threads = process.env.PEERS_THREADS === '1';
/*
 * the tuned rows (neither the "defaults" nor the "agent_delta_interval 0"
 * ones): live deltas joined over an interval, the store's batches held
 * for a while
 */
const deltaInterval = process.env.PEERS_DELTA_INTERVAL || '20ms';
const storeFlush = process.env.PEERS_STORE_FLUSH || '10ms';
const commitDelay = process.env.PEERS_COMMIT_DELAY || '2ms';

const MOCK_PORT = 18190;
const SERVER_PORT = 18191;

const HZ = Number(execFileSync('getconf', ['CLK_TCK']).toString()) || 100;

const servers = [
    { name: 'aisdk', label: 'Vercel AI SDK 7 server (Node 22)',
      start: (dir) => node(dir, 'aisdk-server.mjs',
                           [SERVER_PORT, MOCK_PORT]) },
    { name: 'langgraph-sqlite',
      label: 'LangGraph.js createAgent + SQLite saver',
      start: (dir) => node(dir, 'langgraph-server.mjs',
                           [SERVER_PORT, MOCK_PORT, 'agent',
                            path.join(dir, 'checkpoints.db')]) },
    { name: 'langgraph', label: 'LangGraph.js createReactAgent + MemorySaver',
      start: (dir) => node(dir, 'langgraph-server.mjs',
                           [SERVER_PORT, MOCK_PORT, 'react']) },
    { name: 'floor', floor: true,
      label: 'stock nginx `proxy_pass` relaying the turn\'s 2 replies'
             + ' (the floor)',
      start: (dir) => nginxStart(dir, floorConf(dir)) },
    { name: 'module-default',
      label: 'this module, zone only, defaults (`agent_aisdk`)',
      start: (dir) => nginxStart(dir, moduleConf(dir, false, false)) },
    { name: 'module-store-default',
      label: 'this module with `agent_store`, defaults (`agent_aisdk`)',
      start: (dir) => nginxStart(dir, moduleConf(dir, true, false)) },
    { name: 'module-eager',
      label: 'this module, zone only, `agent_delta_interval 0`'
             + ' (`agent_aisdk`)',
      start: (dir) => nginxStart(dir, moduleConf(dir, false, 'eager')) },
    { name: 'module-store-eager',
      label: 'this module with `agent_store`, `agent_delta_interval 0`'
             + ' (`agent_aisdk`)',
      start: (dir) => nginxStart(dir, moduleConf(dir, true, 'eager')) },
    { name: 'module', label: 'this module, zone only (`agent_aisdk`)',
      start: (dir) => nginxStart(dir, moduleConf(dir, false, true)) },
    { name: 'module-store',
      label: 'this module with `agent_store` (`agent_aisdk`)',
      start: (dir) => nginxStart(dir, moduleConf(dir, true, true)) },
    { name: 'module-store-normal',
      label: 'this module with `agent_store ... sync=normal`'
             + ' (`agent_aisdk`)',
      start: (dir) => nginxStart(dir, moduleConf(dir, true, true,
                                                 'normal')) },
    { name: 'module-events', events: true,
      label: 'this module, zone only (`agent_message` + `agent_events`)',
      start: (dir) => nginxStart(dir, moduleConf(dir, false, true)) },
    { name: 'module-store-events', events: true,
      label: 'this module with `agent_store` (`agent_message` +'
             + ' `agent_events`)',
      start: (dir) => nginxStart(dir, moduleConf(dir, true, true)) },
];

const pacings = (process.env.PEERS_PACINGS || 'trickle,burst').split(',');

/* rounds of every server, a server's figure their median */
const rounds = Number(process.env.PEERS_ROUNDS || 1);

if (!Number.isInteger(rounds) || rounds < 1) {
    process.stderr.write(`PEERS_ROUNDS must be a whole number from 1,`
                         + ` not "${process.env.PEERS_ROUNDS}"\n`);
    process.exit(2);
}

const only = process.env.PEERS_SERVERS
    ? process.env.PEERS_SERVERS.split(',') : null;

/* processes */

function pinned(cmd, args, dir, name) {
    const out = fs.openSync(path.join(dir, name + '.log'), 'a');
    return spawn('taskset', ['-c', '1', cmd, ...args.map(String)],
                 { cwd: here, stdio: ['ignore', out, out] });
}

function node(dir, script, args) {
    return pinned(process.execPath, [script, ...args], dir, 'server');
}

function nginxStart(dir, conf) {
    fs.writeFileSync(path.join(dir, 'nginx.conf'), conf);
    return pinned(nginx, ['-p', dir + '/', '-c', path.join(dir, 'nginx.conf')],
                  dir, 'nginx');
}

function globals(dir, load) {
    return (load ? `load_module ${module};\n` : '')
        + `user root;
daemon off;
worker_processes 1;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;

events {
    worker_connections 1024;
}
`;
}

function httpGlobals(dir) {
    return `    access_log off;
    client_body_temp_path ${dir}/client_body_temp;
    proxy_temp_path ${dir}/proxy_temp;
    fastcgi_temp_path ${dir}/fastcgi_temp;
    uwsgi_temp_path ${dir}/uwsgi_temp;
    scgi_temp_path ${dir}/scgi_temp;

    upstream mock {
        server 127.0.0.1:${MOCK_PORT};
        keepalive 16;
    }
`;
}

const relay = `proxy_pass http://mock;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;`;

function floorConf(dir) {
    return globals(dir, false) + `
http {
${httpGlobals(dir)}
    server {
        listen 127.0.0.1:${SERVER_PORT};

        location = /v1/chat/completions {
            ${relay}
        }
    }
}
`;
}

const SCHEMA = JSON.stringify({
    type: 'object', properties: { city: { type: 'string' } },
    required: ['city'],
});

function moduleConf(dir, store, tuned, sync) {
    return globals(dir, true) + `
http {
${httpGlobals(dir)}
    agent_zone zone=agents:256m;
    ${store ? `agent_store ${dir}/agent.db`
              + (tuned === true && storeFlush !== '0'
                 ? ` flush=${storeFlush}` : '')
              + (tuned === true && commitDelay !== '0'
                 ? ` commit_delay=${commitDelay}` : '')
              + (sync ? ` sync=${sync}` : '') + ';' : ''}
    ${tuned === 'eager' ? 'agent_delta_interval 0;'
      : tuned ? `agent_delta_interval ${deltaInterval};` : ''}

    agent_tool get_weather {
        description "The weather in a city";
        parameters '${SCHEMA}';
        location /tools/weather;
    }

    agent chat {
        provider openai_chat /internal/llm;
        model gpt-mock;
        system "You are terse.";
        tools get_weather;
    }

    server {
        listen 127.0.0.1:${SERVER_PORT};

        location = /api/chat {
            agent chat;
            agent_aisdk;
        }

        location ~ ^/c/(?<cid>[^/]+)/messages$ {
            agent chat;
            agent_conversation $cid;
            agent_message;
        }

        location ~ ^/c/(?<cid>[^/]+)/events$ {
            agent chat;
            agent_conversation $cid;
            agent_events;
        }

        location = /tools/weather {
            internal;
            default_type application/json;
            return 200 '{"city":"Paris","temp":21,"sky":"clear"}';
        }

        location = /internal/llm {
            internal;
            ${relay.replace('http://mock', 'http://mock/v1/chat/completions')}
        }
    }
}
`;
}

function median(values) {
    const v = [...values].sort((a, b) => a - b);
    const mid = Math.floor(v.length / 2);

    return v.length % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

function sleep(ms) {
    return new Promise((r) => setTimeout(r, ms));
}

function children(pid) {
    let kids = [];

    for (const p of fs.readdirSync('/proc')) {
        if (!/^\d+$/.test(p)) {
            continue;
        }

        try {
            const st = fs.readFileSync(`/proc/${p}/stat`, 'utf8');
            const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
            if (Number(f[1]) === pid) {
                kids.push(Number(p), ...children(Number(p)));
            }
        } catch {
            /* gone */
        }
    }

    return kids;
}

/* utime + stime of a process (all its threads), in seconds */

function cpuOf(pid) {
    const st = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) / HZ;
}

function cpu(pids) {
    return pids.reduce((s, p) => s + cpuOf(p), 0);
}

/* time on a CPU of each thread of a process, by thread id, in seconds */

function threadsOf(pid) {
    const t = {};

    for (const tid of fs.readdirSync(`/proc/${pid}/task`)) {
        try {
            const st = fs.readFileSync(`/proc/${pid}/task/${tid}/schedstat`,
                                       'utf8');
            t[tid] = Number(st.split(' ')[0]) / 1e9;
        } catch {
            /* gone */
        }
    }

    return t;
}

/* the load generator */

const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });

function post(urlPath, body) {
    return new Promise((resolve, reject) => {
        const data = Buffer.from(JSON.stringify(body));
        const req = http.request({
            host: '127.0.0.1', port: SERVER_PORT, path: urlPath,
            method: 'POST', agent,
            headers: { 'Content-Type': 'application/json',
                       'Content-Length': data.length },
        }, (res) => {
            const parts = [];
            res.on('data', (d) => parts.push(d));
            res.on('end', () => resolve({
                status: res.statusCode,
                body: Buffer.concat(parts).toString(),
            }));
            res.on('error', reject);
        });
        req.on('error', reject);
        req.end(data);
    });
}

function sseData(body) {
    return body.split('\n').filter((l) => l.startsWith('data: '))
        .map((l) => l.slice(6));
}

/* the assistant's message as useChat builds it from a UI message stream */

function uiMessage(body) {
    const msg = { id: '', role: 'assistant', parts: [] };
    const calls = {};
    let text = null;

    for (const d of sseData(body)) {
        if (d === '[DONE]') {
            continue;
        }

        const c = JSON.parse(d);

        switch (c.type) {
        case 'start':
            msg.id = c.messageId || msg.id;
            break;
        case 'start-step':
            msg.parts.push({ type: 'step-start' });
            break;
        case 'tool-input-available':
            calls[c.toolCallId] = {
                type: 'tool-' + c.toolName, toolCallId: c.toolCallId,
                state: 'input-available', input: c.input,
            };
            msg.parts.push(calls[c.toolCallId]);
            break;
        case 'tool-output-available':
            calls[c.toolCallId].state = 'output-available';
            calls[c.toolCallId].output = c.output;
            break;
        case 'text-start':
            text = { type: 'text', text: '', state: 'streaming' };
            msg.parts.push(text);
            break;
        case 'text-delta':
            text.text += c.delta;
            break;
        case 'text-end':
            text.state = 'done';
            break;
        default:
            break;
        }
    }

    return msg;
}

const want = Array.from({ length: TOKENS }, (_, i) => 'w' + (i + 1))
    .join(' ');

function check(ok, what, body) {
    if (!ok) {
        throw new Error(`${what}: ${body.slice(0, 400)}`);
    }
}

async function chatTurn(conv, n) {
    conv.messages.push({
        id: `${conv.id}-u${n}`, role: 'user',
        parts: [{ type: 'text', text: `weather in Paris, ${n}?` }],
    });

    const r = await post('/api/chat', {
        id: conv.id, messages: conv.messages, trigger: 'submit-message',
        messageId: undefined,
    });

    check(r.status === 200, `turn ${n}: status ${r.status}`, r.body);

    if (conv.ui) {
        const m = uiMessage(r.body);
        const t = m.parts.filter((p) => p.type === 'text')
            .map((p) => p.text).join('');
        check(m.parts.some((p) => p.type === 'tool-get_weather'
                           && p.state === 'output-available')
              && t === want, `turn ${n}: the reply`, r.body);
        conv.messages.push(m);

    } else {
        /* LangGraph: the tokens, one message chunk each */
        const words = sseData(r.body).map((d) => JSON.parse(d))
            .filter((e) => Array.isArray(e))
            .map(([c]) => (c.kwargs || c).content)
            .filter((c) => typeof c === 'string').join('');
        check(words.endsWith(want), `turn ${n}: the reply`, r.body);
        conv.messages.push({ id: `${conv.id}-a${n}`, role: 'assistant',
                             parts: [{ type: 'text', text: words }] });
    }
}

/*
 * the module's own API: the message posted (202), then its events read
 * from its user_msg on until the turn's end, and the stream closed
 */

function events(cid, after) {
    return new Promise((resolve, reject) => {
        const seen = { tool: false, text: null };
        let buf = '';

        const req = http.get({
            host: '127.0.0.1', port: SERVER_PORT, agent: false,
            path: `/c/${cid}/events?after=${after}`,
        }, (res) => {
            res.setEncoding('utf8');
            res.on('data', (d) => {
                buf += d;

                let i;

                while ((i = buf.indexOf('\n\n')) >= 0) {
                    const frame = buf.slice(0, i);
                    buf = buf.slice(i + 2);

                    const ev = /^event: (.*)$/m.exec(frame);
                    const data = /^data: (.*)$/m.exec(frame);

                    if (!ev || !data) {
                        continue;
                    }

                    if (ev[1] === 'tool_result') {
                        seen.tool = true;

                    } else if (ev[1] === 'assistant_msg') {
                        seen.text = JSON.parse(data[1]).content;

                    } else if (ev[1] === 'turn_completed'
                               || ev[1] === 'turn_failed')
                    {
                        seen.end = ev[1];
                        req.destroy();
                        resolve(seen);
                        return;
                    }
                }
            });
            res.on('end', () => resolve(seen));
        });

        req.on('error', (e) => (seen.end ? resolve(seen) : reject(e)));
    });
}

async function eventsTurn(conv, n) {
    const r = await post(`/c/${conv.id}/messages`,
                         { content: `weather in Paris, ${n}?` });

    check(r.status === 202, `turn ${n}: status ${r.status}`, r.body);

    const seen = await events(conv.id, JSON.parse(r.body).seq - 1);

    check(seen.end === 'turn_completed' && seen.tool && seen.text === want,
          `turn ${n}: the reply`, JSON.stringify(seen));
}

/* the floor: the turn's two provider replies through proxy_pass */

async function floorTurn(conv, n) {
    const body = {
        model: 'gpt-mock', stream: true,
        stream_options: { include_usage: true },
        messages: conv.messages.concat([{
            role: 'user', content: `weather in Paris, ${n}?` }]),
    };

    let r = await post('/v1/chat/completions', body);
    check(r.status === 200 && r.body.includes('"arguments":"is\\"}"'),
          `turn ${n}: the call`, r.body);

    const call = JSON.parse(sseData(r.body)[0]).choices[0].delta
        .tool_calls[0];

    body.messages.push({ role: 'assistant', content: null, tool_calls: [{
        id: call.id, type: 'function',
        function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] });
    body.messages.push({ role: 'tool', tool_call_id: call.id,
                         content: '{"city":"Paris","temp":21,"sky":"clear"}' });

    r = await post('/v1/chat/completions', body);
    check(r.status === 200 && r.body.includes('"content":" w200"'),
          `turn ${n}: the reply`, r.body);

    body.messages.push({ role: 'assistant', content: want });
    conv.messages = body.messages;
}

/*
 * A turn's time, from the client's POST to the end of its stream (the
 * module's own API: to turn_completed; the floor: both replies, and the
 * client's tool step between them), in ms, of the measured turns
 */

function percentile(values, p) {
    const v = [...values].sort((a, b) => a - b);

    return v.length ? v[Math.min(v.length - 1, Math.floor(p * v.length))]
        : NaN;
}

async function load(server, prefix, count, times) {
    let next = 0;

    const worker = async () => {
        while (next < count) {
            const conv = { id: `${prefix}-${next++}`, messages: [],
                           ui: !server.name.startsWith('langgraph') };

            for (let n = 1; n <= TURNS; n++) {
                const t0 = process.hrtime.bigint();

                await (server.floor ? floorTurn
                       : server.events ? eventsTurn : chatTurn)(conv, n);

                if (times) {
                    times.push(Number(process.hrtime.bigint() - t0) / 1e6);
                }
            }
        }
    };

    await Promise.all(Array.from({ length: concurrency }, worker));
}

/* the requests the mock has answered */

function served() {
    return new Promise((resolve, reject) => {
        http.get({ host: '127.0.0.1', port: MOCK_PORT, path: '/served',
                   agent: false }, (res) => {
            const parts = [];
            res.on('data', (d) => parts.push(d));
            res.on('end', () => resolve(
                JSON.parse(Buffer.concat(parts).toString()).served));
        }).on('error', reject);
    });
}

async function ready() {
    for (let i = 0; i < 200; i++) {
        const ok = await new Promise((resolve) => {
            const req = http.get({ host: '127.0.0.1', port: SERVER_PORT,
                                   path: '/ready', agent: false }, (res) => {
                res.resume();
                resolve(true);
            });
            req.on('error', () => resolve(false));
        });

        if (ok) {
            return;
        }

        await sleep(100);
    }

    throw new Error('the server did not start');
}

/*
 * The mock of this pacing, once it listens; a mock that cannot (its port
 * taken, say by one a killed run left) stops the run: the servers would
 * be measured against the other
 */

function startMock(pacing) {
    return new Promise((resolve, reject) => {
        const proc = spawn(process.execPath,
                           [path.join(here, 'mock.mjs'), MOCK_PORT, pacing],
                           { stdio: ['ignore', 'pipe', 'inherit'] });
        let out = '';

        proc.stdout.on('data', (d) => {
            out += d;

            if (out.includes('mock listening')) {
                proc.stdout.removeAllListeners('data');
                proc.stdout.resume();
                resolve(proc);
            }
        });

        proc.on('exit', (code) => reject(new Error(
            `the ${pacing} mock exited (${code}) before it listened`
            + ` on ${MOCK_PORT}`)));
    });
}

function stop(proc) {
    return new Promise((resolve) => {
        /* exited, or killed by a signal (a second stop of it) */
        if (proc.exitCode !== null || proc.signalCode !== null) {
            resolve();
            return;
        }

        proc.on('exit', resolve);
        proc.kill('SIGTERM');
    });
}

/* perf record of the module's worker during the measured load */

function perfStart(pid, dir) {
    return spawn('perf', ['record', '-F', '2999', '-p', String(pid),
                          '-o', path.join(dir, 'perf.data')],
                 { stdio: 'ignore' });
}

function perfReport(dir, sort, limit, lines) {
    const out = execFileSync('perf', [
        'report', '--stdio', '--percent-limit', String(limit),
        '-i', path.join(dir, 'perf.data'), '--sort', sort],
        { stdio: ['ignore', 'pipe', 'ignore'] });

    return out.toString().split('\n')
        .filter((l) => l && !l.startsWith('#')).slice(0, lines)
        .map((l) => l.replace(/[\s-]+$/, ''));
}

/* the worker's time by object, then its top functions */

function perfTop(dir) {
    return perfReport(dir, 'dso', 1, 8).concat([''],
        perfReport(dir, 'dso,symbol', 1.5, 20)).join('\n');
}

/* the servers and mocks running, stopped if the run is cut short */
const live = new Set();

async function measure(server, pacing) {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), `peers-${server.name}-`));
    const proc = server.start(dir);

    live.add(proc);

    try {
        await ready();
        await load(server, `warm-${pacing}`, warmup);

        const pids = [proc.pid, ...children(proc.pid)];
        const worker = pids[pids.length - 1];
        const perf = profile && server.name.startsWith('module')
            ? perfStart(worker, dir) : null;

        await sleep(200);

        const c0 = cpu(pids);
        const w0 = threads && server.name.startsWith('module')
            ? threadsOf(worker) : null;
        const t0 = Date.now();
        const s0 = await served();

        const times = [];

        await load(server, `run-${pacing}`, conversations, times);

        /* two model calls a turn, no more (no retries, no extra calls) */
        const calls = await served() - s0;

        check(calls === 2 * TURNS * conversations,
              `${server.name}: ${calls} model calls`, '');

        /* what the server does after the last turn (a store's flush) */
        await sleep(500);

        const c1 = cpu(pids);
        const wall = (Date.now() - t0 - 500) / 1000;
        const turns = conversations * TURNS;

        if (w0) {
            const w1 = threadsOf(worker);
            let pool = 0;
            let busy = 0;
            let loop = 0;

            for (const tid of Object.keys(w1)) {
                const ms = 1000 * (w1[tid] - (w0[tid] || 0)) / turns;

                if (tid === String(worker)) {
                    loop = ms;
                } else {
                    pool += ms;
                    busy += ms > 0 ? 1 : 0;
                }
            }

            process.stderr.write(`${server.name} ${pacing}: the worker's`
                                 + ` CPU ms a turn: event loop`
                                 + ` ${loop.toFixed(3)}, thread pool`
                                 + ` ${pool.toFixed(3)} (${busy}`
                                 + ` threads)\n`);
        }

        let top = null;

        if (perf) {
            await stop(perf);
            top = perfTop(dir);
        }

        await stop(proc);

        /* a figure of a server that logged errors is no figure */
        const errors = logErrors(dir);

        check(errors.length === 0,
              `${server.name}: ${errors.length} errors logged`,
              errors.slice(0, 3).join('\n'));

        return { ms: 1000 * (c1 - c0) / turns, turns, wall, top,
                 pids: pids.length, p50: percentile(times, 0.5),
                 p99: percentile(times, 0.99) };

    } finally {
        await stop(proc);
        live.delete(proc);
        fs.rmSync(dir, { recursive: true, force: true });
    }
}

/* nginx's error.log lines of level error and above, but the probe's 404 */
function logErrors(dir) {
    let log;

    try {
        log = fs.readFileSync(path.join(dir, 'error.log'), 'utf8');
    } catch {
        return [];
    }

    return log.split('\n').filter((l) => /\[(error|crit|alert|emerg)\]/.test(l)
                                         && !/html\/ready/.test(l));
}

function machine() {
    const cpus = os.cpus();
    const release = (() => {
        try {
            const t = fs.readFileSync('/etc/os-release', 'utf8');
            return /PRETTY_NAME="([^"]+)"/.exec(t)[1];
        } catch {
            return os.type();
        }
    })();
    return {
        cpu: `${cpus.length} x ${cpus[0].model}`,
        os: `${release}, Linux ${os.release()}`,
        memory: `${Math.round(os.totalmem() / 2 ** 30)} GB`,
        node: process.version,
        nginx: nginxVersion(),
        load: fs.readFileSync('/proc/loadavg', 'utf8').split(' ')
            .slice(0, 3).join(' '),
    };
}

function nginxVersion() {
    const r = execFileSync('sh', ['-c', `${nginx} -v 2>&1`]).toString();
    return r.trim().replace(/^nginx version: nginx\//, '');
}

function wrap(text, width) {
    const lines = [];
    let line = '';

    for (const w of text.split(' ')) {
        if (line && line.length + 1 + w.length > width) {
            lines.push(line);
            line = w;
        } else {
            line = line ? `${line} ${w}` : w;
        }
    }

    return lines.concat([line]).join('\n');
}

/* the table into bench/README.md, between its two markers */

function readme(md) {
    const file = path.join(here, '..', 'README.md');
    const text = fs.readFileSync(file, 'utf8');
    const begin = '<!-- peers: begin -->\n';
    const end = '<!-- peers: end -->';
    const a = text.indexOf(begin);
    const b = text.indexOf(end);

    if (a < 0 || b < a) {
        process.stdout.write(`no markers in ${file}: not written\n`);
        return;
    }

    fs.writeFileSync(file, text.slice(0, a + begin.length) + md
                     + text.slice(b));
}

function pkgVersion(name) {
    const p = path.join(here, 'node_modules', name, 'package.json');
    return JSON.parse(fs.readFileSync(p, 'utf8')).version;
}

async function main() {
    const mock = {};
    const results = {};
    const tops = [];
    const before = machine();

    /*
     * a run cut short leaves no server, and no mock for the next run to
     * measure against, behind
     */
    process.on('exit', () => {
        for (const proc of live) {
            proc.kill();
        }

        if (mock.proc) {
            mock.proc.kill();
        }
    });
    process.on('SIGINT', () => process.exit(130));
    process.on('SIGTERM', () => process.exit(143));

    for (const pacing of pacings) {
        mock.proc = await startMock(pacing);

        /* each round runs every server once, in turn */
        for (let round = 1; round <= rounds; round++) {
            for (const s of servers) {
                if (only && !only.includes(s.name)) {
                    continue;
                }

                const r = await measure(s, pacing);
                results[s.name] = results[s.name] || {};
                results[s.name][pacing] = results[s.name][pacing] || [];
                results[s.name][pacing].push(r);
                process.stdout.write(
                    `${s.name} ${pacing}`
                    + (rounds > 1 ? ` (round ${round})` : '')
                    + `: ${r.ms.toFixed(2)} ms per turn`
                    + `, a turn's end p50 ${r.p50.toFixed(1)}`
                    + ` p99 ${r.p99.toFixed(1)} ms`
                    + ` (${r.turns} turns, ${r.wall.toFixed(1)} s,`
                    + ` ${r.pids} processes)\n`);

                if (r.top) {
                    tops.push({ name: s.name, pacing, top: r.top });
                }
            }
        }

        await stop(mock.proc);
    }

    const after = machine();
    const fmt = (all, key) => {
        if (!all) {
            return '-';
        }

        const ms = median(all.map((r) => r[key]));
        return ms < 1 ? ms.toFixed(2) : ms.toFixed(1);
    };
    const cols = pacings.map((p) => (p === 'trickle'
        ? 'tokens trickled 1 ms apart' : 'whole reply in one write'));
    const table = (title, cell) => {
        let t = `| ${title} | ${cols.join(' | ')} |\n`
            + `| --- |${pacings.map(() => ' --- |').join('')}\n`;

        for (const s of servers) {
            if (results[s.name]) {
                t += `| ${s.label} | ${pacings.map(
                    (p) => cell(results[s.name][p])).join(' | ')} |\n`;
            }
        }

        return t;
    };
    let md = table('per turn, CPU ms (lower is better)',
                   (all) => fmt(all, 'ms'))
        + '\n'
        + table('a turn\'s end from its POST, ms, p50 / p99',
                (all) => (all ? `${fmt(all, 'p50')} / ${fmt(all, 'p99')}`
                          : '-'));

    const m = after;
    const note = `${conversations} conversations of ${TURNS} turns (${
        conversations * TURNS} turns) per server and pacing, ${concurrency}`
        + ` at a time, after ${warmup} conversations of warm-up`
        + (rounds > 1 ? `; the median of ${rounds} rounds, each of them`
                        + ' running every server in turn.' : '.')
        + ` Machine: ${m.cpu}, ${m.memory}, ${m.os}; nginx ${m.nginx};`
        + ` Node ${m.node}; ai ${pkgVersion('ai')},`
        + ` @ai-sdk/openai-compatible`
        + ` ${pkgVersion('@ai-sdk/openai-compatible')},`
        + ` @langchain/langgraph ${pkgVersion('@langchain/langgraph')},`
        + ` langchain ${pkgVersion('langchain')},`
        + ` @langchain/openai ${pkgVersion('@langchain/openai')},`
        + ` @langchain/langgraph-checkpoint-sqlite`
        + ` ${pkgVersion('@langchain/langgraph-checkpoint-sqlite')}.`
        + ` Load average before ${before.load}, after ${after.load}.`;

    md += '\n' + wrap(note, 72) + '\n';

    for (const t of tops) {
        md += `\nProfile of the worker, ${t.name}, ${t.pacing}`
            + ` (perf, self time):\n\n\`\`\`\n${t.top}\n\`\`\`\n`;
    }

    process.stdout.write('\n' + md);

    /*
     * only a whole run goes into the README; perf's interrupts are
     * charged to the worker: a profiled run's figures are not the table
     */
    if (!profile && !only && !process.env.PEERS_PACINGS) {
        readme(md);
    }
    agent.destroy();
}

main().catch((e) => {
    process.stderr.write(`${e.stack}\n`);
    process.exit(1);
});
