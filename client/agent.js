/*
 * agent.js: a browser client of ngx_http_agent_module's conversation API.
 * No dependencies; an ES module.
 *
 *     import { Conversation } from '/agent.js';
 *
 *     const c = new Conversation('demo', {
 *         tools: { browser_timezone: async () => ({ time_zone: 'UTC' }) }
 *     });
 *     c.addEventListener('change', () => render(c));
 *     c.connect();
 *     await c.send('Hello');
 *
 * The state is rebuilt from the conversation's log (the canonical events
 * the event stream replays), then kept current by the live tail: deltas
 * are applied by message_id and delta_seq, and a streaming_message (the
 * reply so far, sent to a subscriber that joins mid-reply) replaces the
 * reply so far.  A lost connection is made again with Last-Event-ID, so
 * nothing is missed and nothing is applied twice.
 *
 * A conversation with no message yet has no event stream (404): it is
 * "empty", and subscribed to once its first message is sent.  A page
 * that made the id itself says so with { empty: true }; otherwise
 * connect() asks once (a GET of the conversation) before it subscribes.
 */

const EVENT_TYPES = [
    'user_msg', 'assistant_msg', 'tool_call', 'tool_result', 'suspension',
    'resolution', 'turn_completed', 'turn_failed', 'cancelled',
    'turn_halted', 'injection', 'summary', 'rewind', 'turn_started',
    'state_changed',
    'text_delta', 'thinking_delta',
    'tool_call_delta', 'tool_progress', 'turn_ended', 'streaming_message'
];

const PENDING_KINDS = ['approval', 'elicitation', 'client_exec'];

/* how long a client call waits after its suspension before it runs: a
 * replayed log brings its resolution right after, if it has one */
const CLIENT_EXEC_DELAY = 50;

export class Conversation extends EventTarget {

    constructor(id, options = {}) {
        super();

        this.id = id;
        this.base = (options.base ?? '/chat').replace(/\/$/, '');
        this.tools = new Map(Object.entries(options.tools ?? {}));
        this.reconnectDelay = options.reconnectDelay ?? 1000;
        this.maxReconnectDelay = options.maxReconnectDelay ?? 15000;

        this._fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
        this._EventSource = options.EventSource ?? globalThis.EventSource;

        this._reset();

        this.connected = false;
        this._es = null;
        this._timer = null;
        this._delay = this.reconnectDelay;
        this._closed = true;
        this._running = new Set();

        /* no event stream to subscribe to until the first message */
        this.empty = options.empty ?? false;
        this._known = this.empty;

        this._online = () => {
            if (!this._closed && !this.empty) {
                this._open();
            }
        };
    }

    _reset() {
        /* the conversation as the log and the live tail tell it */
        this.lastSeq = 0;
        this.state = 'idle';
        this.turn = 0;
        this.items = [];            /* user, assistant, tool, notice */
        this.calls = new Map();     /* tool_call_id -> call */
        this._drafts = new Map();   /* message_id -> streaming assistant */
        this._done = new Set();     /* message_ids logged */
    }

    /* the waiting calls by kind: { approval: [], elicitation: [],
     * client_exec: [] } */
    get pending() {
        const p = Object.fromEntries(PENDING_KINDS.map(k => [k, []]));

        for (const c of this.calls.values()) {
            if (c.status === 'waiting') {
                (p[c.kind] ??= []).push(c);
            }
        }

        return p;
    }

    /* server calls that run now, each with its progress so far */
    get inFlight() {
        return [...this.calls.values()].filter(c => c.status === 'running');
    }

    get messages() {
        return this.items;
    }

    /* a reply streams: the draft assistant item, or null */
    get streaming() {
        for (const d of this._drafts.values()) {
            return d;
        }
        return null;
    }

    get busy() {
        return this.state !== 'idle';
    }

    registerTool(name, fn) {
        this.tools.set(name, fn);
    }

    url(path = '') {
        return `${this.base}/${encodeURIComponent(this.id)}${path}`;
    }

    /* the event stream */

    connect() {
        this._closed = false;
        globalThis.addEventListener?.('online', this._online);

        if (this._known) {
            if (!this.empty) {
                this._open();
            }
        } else {
            this._probe();
        }

        return this;
    }

    /* whether the conversation exists: a 404 is a new one, with nothing
     * to subscribe to yet; anything else (an error too) subscribes */
    async _probe() {
        let status = 0;

        try {
            status = (await this._fetch(this.url() + '?limit=1')).status;
        } catch {
            /* the event stream retries */
        }

        if (this._closed || this._known) {
            return;
        }

        this._known = true;
        this.empty = status === 404;

        if (this.empty) {
            this._emit('connection');
        } else {
            this._open();
        }
    }

    close() {
        this._closed = true;
        globalThis.removeEventListener?.('online', this._online);
        clearTimeout(this._timer);
        this._es?.close();
        this._es = null;
        this._setConnected(false);
    }

    _open() {
        clearTimeout(this._timer);
        this._es?.close();

        /* a new EventSource cannot set Last-Event-ID; "after" is the
         * same; the browser's own reconnects send the header */
        const es = new this._EventSource(this.url('/events')
                                         + `?after=${this.lastSeq}`);
        this._es = es;

        const handler = e => this._onEvent(e);

        for (const t of EVENT_TYPES) {
            es.addEventListener(t, handler);
        }

        es.onopen = () => {
            this._delay = this.reconnectDelay;
            this._setConnected(true);
        };

        es.onerror = () => {
            this._setConnected(false);

            /* the browser retries a lost connection itself; an answer
             * that is not an event stream (404 before the first message,
             * a 502 of a proxy) closes it, and it is tried again later */
            if (es.readyState === 2 && this._es === es && !this._closed) {
                this._timer = setTimeout(() => this._open(), this._delay);
                this._delay = Math.min(this._delay * 2,
                                       this.maxReconnectDelay);
            }
        };
    }

    _setConnected(on) {
        if (this.connected !== on) {
            this.connected = on;
            this._emit('connection');
        }
    }

    _emit(type) {
        this.dispatchEvent(new Event(type));
        if (type !== 'change') {
            this.dispatchEvent(new Event('change'));
        }
    }

    _onEvent(e) {
        let ev;

        try {
            ev = JSON.parse(e.data);
        } catch {
            return;
        }

        if (ev.seq !== undefined) {
            if (ev.seq <= this.lastSeq) {
                return;                 /* seen already */
            }
            this.lastSeq = ev.seq;
        }

        this.apply(ev);
        this._emit('change');
    }

    /* one event of the stream, canonical or live */

    apply(ev) {
        if (ev.turn > this.turn) {
            this.turn = ev.turn;
        }

        switch (ev.type) {

        case 'user_msg':
            this.items.push({ type: 'user', seq: ev.seq, turn: ev.turn,
                              content: ev.content, ts: ev.ts });
            this.state = 'preparing';
            break;

        case 'assistant_msg':
            this._logged(ev);
            break;

        case 'tool_call': {
            const c = this._call(ev.tool_call_id, ev);
            c.arguments = parseArgs(ev.arguments);
            c.executor = ev.executor;
            c.status = ev.status === 'interrupted' ? 'error' : 'running';
            this._placeCall({ type: 'tool', call: c }, ev);
            this.state = 'executing_tools';
            break;
        }

        case 'suspension': {
            const c = this._call(ev.tool_call_id, ev);
            c.status = 'waiting';
            c.kind = ev.kind;
            c.arguments = ev.arguments ?? c.arguments;
            c.deadline = ev.deadline;
            c.suspensions = (c.suspensions ?? 0) + 1;
            this.state = 'awaiting_input';
            if (ev.kind === 'client_exec') {
                this._scheduleClient(c, c.suspensions);
            }
            break;
        }

        case 'resolution': {
            const c = this._call(ev.tool_call_id, ev);
            c.status = 'running';
            c.resolution = ev;
            this.state = this._waiting() ? 'awaiting_input'
                                         : 'executing_tools';
            if (ev.kind === 'approval' && ev.args) {
                c.arguments = ev.args;
            }
            break;
        }

        case 'tool_result': {
            const c = this._call(ev.tool_call_id, ev);
            c.status = ev.ok ? 'done' : 'error';
            c.ok = ev.ok;
            c.result = ev.result;
            c.error = ev.error;
            break;
        }

        case 'turn_completed':
        case 'turn_failed':
        case 'cancelled':
        case 'turn_halted':
            this._ended(ev);
            break;

        case 'rewind':
            this._rewind(ev);
            break;

        case 'turn_started':
            this.state = 'preparing';
            break;

        case 'state_changed':
            this.state = ev.to;
            break;

        case 'turn_ended':
            this._drafts.clear();
            this.items = this.items.filter(i => !i.draft);
            break;

        case 'text_delta':
        case 'thinking_delta':
        case 'tool_call_delta':
            this._delta(ev);
            break;

        case 'streaming_message':
            this._snapshot(ev);
            break;

        case 'tool_progress': {
            const c = this._call(ev.tool_call_id, ev);
            (c.progress ??= []).push(ev.progress);
            break;
        }
        }
    }

    _waiting() {
        return [...this.calls.values()].some(c => c.status === 'waiting');
    }

    _call(id, ev) {
        let c = this.calls.get(id);

        if (c === undefined) {
            c = { id, name: ev.name, arguments: {}, status: 'running',
                  progress: [] };
            this.calls.set(id, c);
        }

        return c;
    }

    _draft(id, turn) {
        let d = this._drafts.get(id);

        if (d === undefined) {
            d = { type: 'assistant', message_id: id, turn, text: '',
                  thinking: '', toolCalls: [], status: 'streaming',
                  draft: true, deltaSeq: 0 };
            this._drafts.set(id, d);
            this.items.push(d);
        }

        return d;
    }

    _delta(ev) {
        if (this._done.has(ev.message_id)) {
            return;
        }

        const d = this._draft(ev.message_id, ev.turn);

        if (ev.delta_seq === 1 && d.deltaSeq > 0) {
            /* the model call was made again (its worker died) */
            d.text = d.thinking = '';
            d.toolCalls = [];
        } else if (ev.delta_seq <= d.deltaSeq) {
            return;
        }

        d.deltaSeq = ev.delta_seq;
        this.state = 'streaming';

        if (ev.type === 'text_delta') {
            d.text += ev.delta;
        } else if (ev.type === 'thinking_delta') {
            d.thinking += ev.delta;
        } else {
            d.toolCalls[ev.index] = (d.toolCalls[ev.index] ?? '') + ev.delta;
        }
    }

    _snapshot(ev) {
        if (this._done.has(ev.message_id)) {
            return;
        }

        const d = this._draft(ev.message_id, ev.turn);

        d.text = ev.text ?? '';
        d.thinking = ev.thinking ?? '';
        d.toolCalls = [];
        for (const tc of ev.tool_calls ?? []) {
            d.toolCalls[tc.index] = tc.arguments;
        }
        d.deltaSeq = ev.delta_seq;
        this.state = 'streaming';
    }

    _logged(ev) {
        const m = { type: 'assistant', seq: ev.seq, turn: ev.turn,
                    message_id: ev.message_id, text: ev.content ?? '',
                    thinking: ev.thinking ?? '', status: ev.status,
                    toolCalls: ev.tool_calls ?? [],
                    finishReason: ev.finish_reason };
        const d = this._drafts.get(ev.message_id);

        this._done.add(ev.message_id);

        if (d !== undefined) {
            this._drafts.delete(ev.message_id);
            this.items[this.items.indexOf(d)] = m;
        } else {
            this.items.push(m);
        }
    }

    /* A tool the provider ran while it wrote its reply (a web search) is
     * logged after the reply; it is placed above the reply's text, after
     * the other tools it ran, as the provider ran it first. */
    _placeCall(item, ev) {
        let at = -1;

        if (ev.provider_executed) {
            at = this.items.findLastIndex(i => i.type === 'assistant'
                                               && i.turn === ev.turn);
        }

        if (at < 0) {
            this.items.push(item);
        } else {
            this.items.splice(at, 0, item);
        }
    }

    /* the context goes on from ev.to_seq: what came after it is a
     * superseded branch (kept in the log), and leaves the page */
    _rewind(ev) {
        const at = this.items.findIndex(i => i.seq !== undefined
                                             && i.seq > ev.to_seq);

        if (at < 0) {
            return;
        }

        for (const i of this.items.slice(at)) {
            if (i.type === 'tool') {
                this.calls.delete(i.call.id);
            }
        }

        this.items = this.items.slice(0, at);
    }

    _ended(ev) {
        this._drafts.clear();
        this.items = this.items.filter(i => !i.draft);

        for (const c of this.calls.values()) {
            if (c.status === 'waiting' || c.status === 'running') {
                c.status = 'error';
            }
        }

        if (ev.type !== 'turn_completed') {
            this.items.push({ type: 'notice', kind: ev.type, seq: ev.seq,
                              turn: ev.turn, reason: ev.reason,
                              error: ev.error });
        }

        this.state = 'idle';
    }

    /* client tools: a client_exec call runs the registered function and
     * resolves with its result */

    _scheduleClient(call, n) {
        setTimeout(() => {
            const key = `${call.id}/${n}`;

            if (call.status !== 'waiting' || call.kind !== 'client_exec'
                || call.suspensions !== n || this._running.has(key))
            {
                return;
            }

            const fn = this.tools.get(call.name);

            if (fn === undefined) {
                return;     /* another page may know it */
            }

            this._running.add(key);
            this._runClient(call, fn);
        }, CLIENT_EXEC_DELAY);
    }

    async _runClient(call, fn) {
        let result;

        try {
            result = await fn(call.arguments ?? {}, call);
        } catch (e) {
            result = { error: String(e?.message ?? e) };
        }

        /* a 409 stale: another page resolved it first */
        await this.resolve(call.id, { result: result ?? null })
            .catch(() => {});
    }

    /* requests */

    async _post(path, body) {
        const r = await this._fetch(this.url(path), {
            method: 'POST',
            headers: { 'Content-Type': 'application/json' },
            body: JSON.stringify(body ?? {})
        });
        let json = null;

        try {
            json = await r.json();
        } catch {
            /* an answer that is not JSON */
        }

        return { status: r.status, ok: r.ok, body: json };
    }

    /* resolves to the answer's JSON; throws an Error with status and
     * code for an error answer, and on network errors */
    async send(content, sourceId = randomId()) {
        const r = await this._post('/messages', { content,
                                                  source_id: sourceId });

        if (!r.ok) {
            throw apiError(r);
        }

        this._known = true;

        if (this.empty) {
            this.empty = false;
            this._emit('connection');
        }

        if (!this._closed && !this.connected) {
            this._open();   /* the first message made the conversation */
        }

        return r.body;
    }

    /* the last reply made again (or the reply to the user message of
     * seq), from the same context; the old one stays in the log as a
     * superseded branch.  The answer's JSON; throws as send() does
     * (409 busy, not_on_branch, summarized, stale) */
    async regenerate(seq) {
        return this._rewound({ regenerate: seq ?? true });
    }

    /* the user message of seq given a new text: the context goes on from
     * just before it */
    async edit(seq, content, sourceId = randomId()) {
        return this._rewound({ edit: seq, content, source_id: sourceId });
    }

    async _rewound(body) {
        const r = await this._post('/messages', body);

        if (!r.ok) {
            throw apiError(r);
        }

        return r.body;
    }

    /* body: { result } for elicitation and client_exec; { decision,
     * reason, args } for approval.  Resolves to { ok: true, ... }, or
     * { ok: false, stale: true } when the call no longer waits (another
     * page answered it, or it expired); throws on other errors */
    async resolve(toolCallId, body) {
        const r = await this._post(`/calls/${encodeURIComponent(toolCallId)}`,
                                   body);

        if (r.status === 409) {
            return { ok: false, stale: true };
        }

        if (!r.ok) {
            throw apiError(r);
        }

        return { ok: true, ...r.body };
    }

    approve(toolCallId, args) {
        return this.resolve(toolCallId, args === undefined
                            ? { decision: 'approve' }
                            : { decision: 'approve', args });
    }

    reject(toolCallId, reason) {
        return this.resolve(toolCallId, reason
                            ? { decision: 'reject', reason }
                            : { decision: 'reject' });
    }

    answer(toolCallId, result) {
        return this.resolve(toolCallId, { result });
    }

    async cancel() {
        const r = await this._post('/cancel');

        if (!r.ok) {
            throw apiError(r);
        }

        return r.body;
    }
}

function parseArgs(a) {
    if (typeof a !== 'string') {
        return a ?? {};
    }

    try {
        return JSON.parse(a);
    } catch {
        return a;
    }
}

function apiError(r) {
    const e = r.body?.error ?? {};
    const err = new Error(e.message ?? `HTTP ${r.status}`);

    err.status = r.status;
    err.code = e.code;
    err.body = r.body;

    return err;
}

function randomId() {
    if (globalThis.crypto?.randomUUID) {
        return globalThis.crypto.randomUUID();
    }
    return Math.random().toString(36).slice(2) + Date.now().toString(36);
}
