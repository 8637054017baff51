// The clients of t/scaleout.t and bench/cluster.pl: N conversations
// through the front tier of a cluster, in one Node process.  No
// packages: Node's own http.
//
//   node cluster_load.mjs FRONT_PORT N TURNS OUT_FILE
//
// Per conversation (c1..cN), for each turn once the test says "go TURN"
// on stdin: a message "scale CID TURN" with source_id CID-TURN, sent
// again until an answer is 2xx; the approval the turn waits for (a
// suspension event) looked at with inspect (its deadline) and approved
// a while later (asked again after a 409 until the log has it
// resolved), unless the conversation is one of those whose approval
// is left to expire (CID number divisible by 3); then the turn's end
// (turn_completed, turn_failed or cancelled).  One subscriber per
// conversation, from its first acknowledged message: it reconnects with
// Last-Event-ID when its stream ends, fails or stays silent for 4 s (the
// nodes send a heartbeat comment every second).  Every request's answer
// and every canonical event the subscriber got are recorded.
//
// stdout: "status TURN acked suspended done" every 250 ms, "turn TURN
// done SECONDS" once every conversation has ended it.  stdin "end"
// writes OUT_FILE (JSON: per conversation its attempts, deadlines and
// events) and exits.
//
//   node cluster_load.mjs bench FRONT_PORT SECONDS CLIENTS
//
// bench/cluster.pl's load: CLIENTS clients, each running turns back to
// back for SECONDS, a new conversation per turn: a message "bench"
// timed to its 202, then its events until the turn ends.  One line of
// JSON: turns, the 202s' p50 and p99 in ms, the answers that were not.

import http from 'node:http';
import fs from 'node:fs';
import readline from 'node:readline';

const bench = process.argv[2] === 'bench';
const [port, n, turns, out] = process.argv.slice(bench ? 3 : 2);
const N = Number(n);
const TURNS = Number(turns);

const agent = new http.Agent({ keepAlive: true, maxSockets: 2048 });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const now = () => Date.now();

function request(method, path, body) {
    const start = process.hrtime.bigint();
    const headers = body ? { 'Content-Type': 'application/json',
                             'Content-Length': Buffer.byteLength(body) }
                         : {};

    return new Promise((resolve) => {
        const req = http.request({ host: '127.0.0.1', port: Number(port),
                                   method, path, agent, headers,
                                   timeout: 15000 }, (res) => {
            const parts = [];
            res.on('data', (d) => parts.push(d));
            res.on('end', () => {
                const text = Buffer.concat(parts).toString();
                let json = null;
                try { json = JSON.parse(text); } catch (e) { /* none */ }
                resolve({ status: res.statusCode, json,
                          owner: res.headers['x-agent-owner'],
                          ms: Number(process.hrtime.bigint() - start) / 1e6
                });
            });
            res.on('error', () => resolve({ status: 0 }));
        });

        req.on('timeout', () => req.destroy(new Error('timeout')));
        req.on('error', () => resolve({ status: 0 }));
        req.end(body);
    });
}

// a conversation's record and its subscriber

class Conversation {
    constructor(i) {
        this.id = `c${i}`;
        this.expire = i % 3 === 0;
        this.rec = { messages: [], resolves: [], deadlines: [], events: [],
                     duplicates: 0, gaps: [], reconnects: 0, ends: {} };
        this.last = 0;
        this.waiters = [];
        this.subscribed = false;
        this.stopped = false;
    }

    // resolves once pred(event) holds for an event logged so far or later

    wait(pred, ms) {
        const found = this.rec.events.find(pred);
        if (found) {
            return Promise.resolve(found);
        }

        return new Promise((resolve) => {
            const w = { pred, resolve };
            this.waiters.push(w);
            setTimeout(() => {
                this.waiters = this.waiters.filter((x) => x !== w);
                resolve(null);
            }, ms).unref();
        });
    }

    event(e) {
        const seq = Number(e.id);

        if (seq <= this.last) {
            this.rec.duplicates++;
            return;
        }

        if (seq !== this.last + 1) {
            this.rec.gaps.push([this.last, seq]);
        }

        this.last = seq;

        let data = {};
        try { data = JSON.parse(e.data); } catch (x) { /* recorded as is */ }

        const ev = { seq, type: e.event, turn: data.turn, t: now(),
                     tool_call_id: data.tool_call_id,
                     deadline: data.deadline, source_id: data.source_id,
                     ts: data.ts };
        this.rec.events.push(ev);

        for (const w of this.waiters.slice()) {
            if (w.pred(ev)) {
                this.waiters = this.waiters.filter((x) => x !== w);
                w.resolve(ev);
            }
        }
    }

    subscribe() {
        if (this.subscribed) {
            return;
        }

        this.subscribed = true;
        this.stream();
    }

    stream() {
        if (this.stopped) {
            return;
        }

        const headers = this.last ? { 'Last-Event-ID': String(this.last) }
                                  : {};
        let buf = '';
        let timer = null;
        let done = false;

        const again = () => {
            if (done) {
                return;
            }
            done = true;
            clearTimeout(timer);
            req.destroy();
            this.rec.reconnects++;
            setTimeout(() => this.stream(), 200);
        };

        const watch = () => {
            clearTimeout(timer);
            timer = setTimeout(again, 4000);
        };

        const req = http.request({ host: '127.0.0.1', port: Number(port),
                                   path: `/c/${this.id}/events`, headers,
                                   agent: false }, (res) => {
            if (res.statusCode !== 200) {
                res.resume();
                res.on('end', again);
                res.on('error', again);
                return;
            }

            res.setEncoding('utf8');
            res.on('data', (d) => {
                watch();
                buf += d;
                let i;
                while ((i = buf.indexOf('\n\n')) >= 0) {
                    const block = buf.slice(0, i);
                    buf = buf.slice(i + 2);
                    const e = {};
                    for (const line of block.split('\n')) {
                        const m = line.match(/^(id|event|data): ?(.*)$/);
                        if (m) {
                            e[m[1]] = m[2];
                        }
                    }
                    if (e.id !== undefined) {
                        this.event(e);
                    }
                }
            });
            res.on('end', again);
            res.on('error', again);
        });

        this.req = req;
        req.on('error', again);
        watch();
        req.end();
        this.kill = () => { done = true; clearTimeout(timer); req.destroy(); };
    }

    stop() {
        this.stopped = true;
        if (this.kill) {
            this.kill();
        }
    }

    async send(turn) {
        const body = JSON.stringify({ content: `scale ${this.id} ${turn}`,
                                      source_id: `${this.id}-${turn}` });
        const start = now();

        while (now() - start < 90000) {
            const r = await request('POST', `/c/${this.id}/messages`, body);
            this.rec.messages.push({ turn, status: r.status, t: now(),
                                     ms: r.ms,
                                     code: r.json && r.json.error
                                           ? r.json.error.code : undefined,
                                     duplicate: r.json && r.json.duplicate });
            if (r.status >= 200 && r.status < 300) {
                return r;
            }
            await sleep(300);
        }

        return null;
    }

    async approve(turn, susp) {
        const id = susp.tool_call_id;
        const start = now();

        // a while first: some approvals straddle a fault
        await sleep(300 + Math.random() * 3500);

        while (now() - start < 90000) {
            const c = await request('GET', `/c/${this.id}?limit=1`);
            if (c.status === 200) {
                const p = (c.json.pending || []).find(
                    (x) => x.tool_call_id === id);
                if (p) {
                    this.rec.deadlines.push({ id, logged: susp.deadline,
                                              seen: p.deadline });
                }
            }

            const r = await request('POST',
                                    `/c/${this.id}/calls/${id}`,
                                    JSON.stringify({ decision: 'approve' }));
            this.rec.resolves.push({ turn, id, status: r.status, t: now(),
                                     code: r.json && r.json.error
                                           ? r.json.error.code
                                           : undefined });
            if (r.status >= 200 && r.status < 300) {
                return;
            }

            // 409: not waiting; done if the log says so (an answer lost
            // in a fault), else asked again
            await sleep(300);
            if (r.status === 409 && this.rec.events.find(
                    (e) => e.tool_call_id === id
                           && /^(resolution|tool_result)$/.test(e.type))) {
                return;
            }
        }
    }

    async turn(turn) {
        if (!await this.send(turn)) {
            this.rec.ends[turn] = 'never acknowledged';
            return;
        }

        acked[turn]++;
        this.subscribe();

        const isTurn = (e) => e.turn === turn;
        const susp = await this.wait((e) => isTurn(e)
                                     && e.type === 'suspension', 60000);
        if (susp) {
            suspended[turn]++;
            if (!this.expire) {
                await this.approve(turn, susp);
            }
        }

        const end = await this.wait((e) => isTurn(e)
            && /^(turn_completed|turn_failed|cancelled)$/.test(e.type),
            90000);
        this.rec.ends[turn] = end ? end.type : 'no end seen';
        ended[turn]++;
    }
}

// bench: a turn's events read until it ends

function turnEnd(cid) {
    return new Promise((resolve) => {
        const req = http.request({ host: '127.0.0.1', port: Number(port),
                                   path: `/c/${cid}/events`, agent },
                                 (res) => {
            let text = '';
            res.setEncoding('utf8');
            res.on('data', (d) => {
                text += d;
                if (/event: (turn_completed|turn_failed)/.test(text)) {
                    req.destroy();
                    resolve(true);
                }
            });
            res.on('end', () => resolve(false));
            res.on('error', () => resolve(false));
        });
        req.on('error', () => resolve(false));
        req.end();
    });
}

function pct(v, p) {
    const s = v.slice().sort((a, b) => a - b);
    return s.length ? s[Math.round(p / 100 * (s.length - 1))] : null;
}

if (bench) {
    const end = now() + Number(n) * 1000;
    const acks = [];
    let turnsDone = 0;
    let errors = 0;

    const client = async (k) => {
        for (let i = 0; now() < end; i++) {
            const cid = `b${process.pid}-${k}-${i}`;
            const r = await request('POST', `/c/${cid}/messages`,
                                    '{"content":"bench"}');
            if (r.status !== 202) {
                errors++;
                await sleep(100);
                continue;
            }
            acks.push(r.ms);
            if (await turnEnd(cid)) {
                turnsDone++;
            } else {
                errors++;
            }
        }
    };

    const clients = [];
    for (let k = 0; k < Number(turns); k++) {
        clients.push(client(k));
    }
    await Promise.all(clients);

    console.log(JSON.stringify({ turns: turnsDone, errors,
                                 ack_p50: pct(acks, 50),
                                 ack_p99: pct(acks, 99) }));
    process.exit(0);
}

const convs = [];
for (let i = 1; i <= N; i++) {
    convs.push(new Conversation(i));
}

const acked = {};
const suspended = {};
const ended = {};
let current = 0;

setInterval(() => {
    if (current) {
        console.log(`status ${current} ${acked[current]} `
                    + `${suspended[current]} ${ended[current]}`);
    }
}, 250);

async function go(turn) {
    current = turn;
    acked[turn] = suspended[turn] = ended[turn] = 0;
    const start = now();
    await Promise.all(convs.map((c) => c.turn(turn)));
    console.log(`turn ${turn} done ${(now() - start) / 1000}`);
}

const rl = readline.createInterface({ input: process.stdin });

rl.on('line', (line) => {
    const [cmd, arg] = line.trim().split(' ');

    if (cmd === 'go' && Number(arg) <= TURNS) {
        go(Number(arg));
    } else if (cmd === 'end') {
        const rec = {};
        for (const c of convs) {
            c.stop();
            rec[c.id] = c.rec;
        }
        fs.writeFileSync(out, JSON.stringify(rec));
        process.exit(0);
    }
});
