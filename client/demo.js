/*
 * The demo page: a chat over agent.js.  Each item of the conversation
 * has one element, made once and updated in place, so that a form being
 * filled in survives the events that arrive meanwhile.
 */

import { Conversation } from './agent.js';
import { markdown } from './markdown.js';

const $ = id => document.getElementById(id);

/* the client tools this page runs when the agent calls them */
const tools = {
    browser_timezone: async () => ({
        time_zone: Intl.DateTimeFormat().resolvedOptions().timeZone,
        utc_offset_minutes: -new Date().getTimezoneOffset()
    })
};

/* the conversation of the address, or a new one: an id made here has
 * nothing to subscribe to before its first message */
function conversation() {
    const m = location.hash.match(/^#c=([A-Za-z0-9_.:-]{1,64})$/);

    if (m) {
        return new Conversation(m[1], { tools });
    }

    const id = 'web-' + Math.random().toString(36).slice(2, 10);
    history.replaceState(null, '', '#c=' + id);
    return new Conversation(id, { tools, empty: true });
}

const conv = conversation();
const views = new Map();     /* item -> element */
const described = new Map(); /* tool name -> its description */
let frame = 0;
let focusNext = null;        /* a new card's first control */
let helpFolded = false;
let queuedAfter = null;      /* the turn a queued message waits for */

const QUEUED = 'Queued: it runs after the current turn.';

window.conversation = conv;  /* for the console, and for tests */

function h(tag, attrs = {}, ...kids) {
    const el = document.createElement(tag);

    for (const [k, v] of Object.entries(attrs)) {
        if (k.startsWith('on')) {
            el.addEventListener(k.slice(2), v);
        } else if (v === true) {
            el.setAttribute(k, '');
        } else if (v !== false && v != null) {
            el.setAttribute(k, v);
        }
    }

    el.append(...kids.flat().filter(k => k != null));
    return el;
}

function say(text) {
    $('status').textContent = text;
}

function pretty(v) {
    return typeof v === 'string' ? v : JSON.stringify(v, null, 2);
}

/* rendering */

function schedule() {
    if (frame === 0) {
        frame = requestAnimationFrame(render);
    }
}

function render() {
    const log = $('log');
    const page = document.scrollingElement;
    const atEnd = page.scrollHeight - page.scrollTop - innerHeight < 80;
    const seen = new Set();
    let prev = null;

    frame = 0;

    for (const item of conv.items) {
        let el = views.get(item);

        if (el === undefined) {
            el = make(item);
            views.set(item, el);
        }

        update(item, el);
        seen.add(item);

        if (prev === null ? log.firstChild !== el : prev.nextSibling !== el) {
            if (prev === null) {
                log.prepend(el);
            } else {
                prev.after(el);
            }
        }
        prev = el;
    }

    for (const [item, el] of views) {
        if (!seen.has(item)) {
            el.remove();
            views.delete(item);
        }
    }

    const conn = conv.connected ? 'connected'
                 : conv.empty ? 'ready' : 'reconnecting';

    $('conn').textContent = conn;
    $('conn').className = 'conn ' + (conn === 'reconnecting' ? 'off' : 'on');
    $('state').textContent = conv.state.replace('_', ' ');
    $('cancel').disabled = !conv.busy;

    /* the help folds away once the conversation has begun */
    if (conv.items.length > 0 && !helpFolded) {
        helpFolded = true;
        document.querySelector('details.help').open = false;
    }
    document.body.dataset.state = conv.state;
    document.body.dataset.lastSeq = conv.lastSeq;

    /* a queued message's turn has begun: it waits no more */
    if (queuedAfter !== null && conv.turn > queuedAfter) {
        queuedAfter = null;
        if ($('status').textContent === QUEUED) {
            say('');
        }
    }

    if (atEnd) {
        page.scrollTop = page.scrollHeight;
    }

    /* a card that asks for something takes the focus from the composer,
     * not from another card */
    if (focusNext !== null && (document.activeElement === document.body
                               || document.activeElement === $('input')))
    {
        focusNext.focus();
    }
    focusNext = null;
}

function make(item) {
    switch (item.type) {
    case 'user': {
        const li = h('li', { class: 'msg user', 'data-seq': item.seq },
                     h('p', {}, item.content));
        li.append(h('button', { type: 'button', class: 'edit',
                                title: 'Edit this message: the conversation '
                                       + 'goes on from here',
                                onclick: () => editUser(item, li) },
                    'Edit'));
        return li;
    }

    case 'assistant':
        return h('li', { class: 'msg assistant' },
                 h('details', { class: 'thinking', hidden: true },
                   h('summary', {}, 'Thinking'), h('p')),
                 h('div', { class: 'text' }),
                 h('span', { class: 'badge', hidden: true }),
                 h('button', { type: 'button', class: 'regenerate',
                               hidden: true, onclick: regenerate },
                   'Regenerate'));

    case 'tool':
        if (item.call.executor === 'provider') {
            return h('li', { class: 'tool hosted', 'data-call': item.call.id,
                             'data-name': item.call.name },
                     h('div', { class: 'tool-head' },
                       h('span', { class: 'tool-name' }),
                       h('span', { class: 'tool-status' })),
                     h('ul', { class: 'sources', hidden: true }));
        }

        return h('li', { class: 'tool', 'data-call': item.call.id,
                         'data-name': item.call.name },
                 h('div', { class: 'tool-head' },
                   h('span', { class: 'tool-name' }, title(item.call.name)),
                   h('span', { class: 'tool-status' })),
                 h('dl', { class: 'tool-args' }),
                 h('div', { class: 'tool-progress', hidden: true },
                   h('progress', { max: 1, value: 0 }), h('span')),
                 h('div', { class: 'tool-action' }),
                 h('div', { class: 'tool-result', hidden: true }),
                 h('details', { class: 'tool-json' },
                   h('summary', {}, 'Details'),
                   h('p', {}, 'Tool ', h('code', {}, item.call.name)),
                   h('pre', { class: 'json' })));

    default:
        return h('li', { class: 'notice ' + item.kind });
    }
}

function update(item, el) {
    switch (item.type) {
    case 'assistant': {
        const think = el.querySelector('.thinking');

        const text = el.querySelector('.text');
        const badge = el.querySelector('.badge');

        think.hidden = !item.thinking;
        think.querySelector('p').textContent = item.thinking;
        if (text.dataset.md !== item.text) {
            text.dataset.md = item.text;
            text.replaceChildren(markdown(item.text));
        }
        el.classList.toggle('streaming', item.status === 'streaming');
        el.dataset.status = item.status;
        el.dataset.messageId = item.message_id;
        el.hidden = !item.text && !item.thinking;
        badge.hidden = item.status !== 'cancelled'
                       && item.status !== 'interrupted';
        badge.textContent = item.status;

        /* the last reply, once the turn has ended, can be made again */
        el.querySelector('.regenerate').hidden = conv.busy
            || item !== conv.items.findLast(i => i.type === 'assistant');
        break;
    }

    case 'user':
        el.querySelector('.edit').hidden = conv.busy;
        break;

    case 'tool':
        if (item.call.executor === 'provider') {
            updateHosted(item.call, el);
        } else {
            updateTool(item.call, el);
        }
        break;

    case 'notice':
        el.textContent = item.kind === 'cancelled'
            ? 'Stopped.'
            : 'The turn failed: ' + (item.reason ?? '')
              + (item.error ? ' (' + item.error + ')' : '');
        break;
    }
}

const STATUS = {
    running: 'running',
    done: 'done',
    error: 'failed'
};

/*
 * A tool the provider ran itself, a web search most often: what it looked
 * for and, when the provider says, the pages it found: a Responses
 * web_search_call's action.sources, or the results of Anthropic's
 * web_search_tool_result.
 */
function updateHosted(call, el) {
    const args = call.arguments ?? {};
    const web = /web_search/.test(call.name);
    const query = typeof args.query === 'string' ? args.query : '';
    const done = call.status === 'done' || call.status === 'error';

    el.dataset.status = call.status;
    el.querySelector('.tool-name').textContent =
        web ? (done ? 'Searched the web' : 'Searching the web')
              + (query ? ' for \u201c' + query + '\u201d' : '')
            : call.name + (query ? ': ' + query : '');
    el.querySelector('.tool-status').textContent =
        call.status === 'error' ? 'failed' : '';

    const r = call.result ?? {};
    const found = (r.action?.sources ?? (Array.isArray(r.content)
                                         ? r.content : []))
        .filter(p => p && typeof p.url === 'string'
                     && /^https?:\/\//.test(p.url));
    const list = el.querySelector('.sources');

    list.hidden = found.length === 0;
    list.replaceChildren(...found.map(p =>
        h('li', {}, h('a', { href: p.url, target: '_blank',
                             rel: 'noopener noreferrer' },
                      p.title || p.url))));
}

/* a tool's name for people: the first words of its description, from
 * the agent's agent_describe, or its name made readable */
function title(name) {
    const d = described.get(name);

    if (d) {
        return d.split(/[;:.](\s|$)/)[0];
    }

    const s = name.replace(/[_-]+/g, ' ');
    return s.charAt(0).toUpperCase() + s.slice(1);
}

/* a value, an object's members as a list of names and values */
function readable(v) {
    if (v === null || typeof v !== 'object' || Array.isArray(v)
        && v.every(x => x === null || typeof x !== 'object'))
    {
        return h('span', { class: 'value' },
                 Array.isArray(v) ? v.join(', ') : String(v));
    }

    if (Array.isArray(v)) {
        return h('ol', {}, v.map(x => h('li', {}, readable(x))));
    }

    return h('dl', {}, Object.entries(v).flatMap(([k, x]) => [
        h('dt', {}, k.replace(/_/g, ' ')), h('dd', {}, readable(x))
    ]));
}

function updateTool(call, el) {
    const waiting = call.status === 'waiting' ? call.kind : '';
    const status = waiting === 'approval' ? 'needs your approval'
        : waiting === 'elicitation' ? 'waiting for your answer'
        : waiting === 'client_exec' ? 'runs in your browser'
        : STATUS[call.status];
    const args = el.querySelector('.tool-args');
    const argsJson = JSON.stringify(call.arguments);

    el.dataset.status = call.status;
    el.dataset.kind = waiting;
    el.querySelector('.tool-name').textContent = title(call.name);
    el.querySelector('.tool-status').textContent = status;
    if (args.dataset.json !== argsJson) {
        args.dataset.json = argsJson;
        args.replaceChildren(...(call.arguments
                                 && typeof call.arguments === 'object'
                                 && !Array.isArray(call.arguments)
                                 ? readable(call.arguments).childNodes
                                 : [h('dd', {}, pretty(call.arguments))]));
    }
    args.hidden = call.executor === 'human' || argsJson === '{}';
    el.querySelector('.tool-json .json').textContent = JSON.stringify({
        arguments: call.arguments,
        ...(call.status === 'done' || call.status === 'error'
            ? (call.ok ? { result: call.result }
                       : { error: call.error ?? null }) : {})
    }, null, 2);

    const p = call.progress ?? [];
    const bar = el.querySelector('.tool-progress');

    if (p.length > 0) {
        const last = p[p.length - 1];

        bar.hidden = false;
        if (last && typeof last === 'object' && last.of) {
            bar.querySelector('progress').max = last.of;
            bar.querySelector('progress').value = last.step ?? 0;
        }
        bar.querySelector('span').textContent =
            typeof last === 'object' && last.doing ? last.doing : pretty(last);
    }

    const res = el.querySelector('.tool-result');

    if ((call.status === 'done' || call.status === 'error')
        && res.dataset.shown !== call.status)
    {
        res.dataset.shown = call.status;
        res.hidden = false;
        res.replaceChildren(call.ok
            ? readable(call.result)
            : h('span', {}, 'Failed: ' + (call.error ?? 'no result')));
        res.classList.toggle('error', !call.ok);
    }

    /* the card that asks for something: made once per suspension */
    const action = el.querySelector('.tool-action');
    const key = waiting ? waiting + '/' + call.suspensions : '';

    if (action.dataset.key !== key) {
        action.dataset.key = key;
        action.replaceChildren();

        if (waiting === 'approval') {
            action.append(approvalCard(call));
        } else if (waiting === 'elicitation') {
            action.append(elicitationForm(call));
        }

        focusNext = action.querySelector('input, select, textarea, button')
                    ?? focusNext;
    }
}

/* approval: approve, reject with a reason, or approve edited arguments */

function approvalCard(call) {
    const id = 'edit-' + call.id;
    const reason = h('input', { type: 'text', class: 'reason',
                                'aria-label': 'Reason for rejecting',
                                placeholder: 'Reason (optional)' });
    const edit = h('textarea', { id, rows: 4, class: 'edit-args',
                                 spellcheck: 'false' },
                   JSON.stringify(call.arguments, null, 2));
    const err = h('span', { class: 'error', role: 'alert' });

    const act = async (fn, what) => {
        card.querySelectorAll('button').forEach(b => { b.disabled = true; });
        try {
            const r = await fn();
            say(r.stale ? 'That call no longer waits.' : what);
        } catch (e) {
            say('Could not resolve: ' + e.message);
            card.querySelectorAll('button').forEach(b => {
                b.disabled = false;
            });
        }
    };

    const card = h('div', { class: 'approval', role: 'group',
                            'aria-label': 'Approve ' + call.name },
        h('div', { class: 'row' },
          h('button', { type: 'button', class: 'approve',
                        onclick: () => act(() => conv.approve(call.id),
                                           'Approved.') }, 'Approve'),
          reason,
          h('button', { type: 'button', class: 'reject',
                        onclick: () => act(() => conv.reject(call.id,
                                                              reason.value),
                                           'Rejected.') }, 'Reject')),
        h('details', { class: 'edit' },
          h('summary', {}, 'Edit arguments'),
          h('label', { for: id, class: 'visually-hidden' },
            'Arguments as JSON'),
          edit,
          h('div', { class: 'row' },
            h('button', { type: 'button', class: 'approve-edited',
                          onclick: () => {
                              let args;
                              try {
                                  args = JSON.parse(edit.value);
                              } catch (e) {
                                  err.textContent = 'Not JSON: ' + e.message;
                                  return;
                              }
                              err.textContent = '';
                              act(() => conv.approve(call.id, args),
                                  'Approved with your arguments.');
                          } }, 'Approve with these arguments'),
            err)));

    return card;
}

/* elicitation: a form made from the JSON Schema the call asks with, or
 * a single answer */

function elicitationForm(call) {
    const args = call.arguments ?? {};
    const schema = args.schema && args.schema.type === 'object'
                   && args.schema.properties ? args.schema : null;
    const required = new Set(schema?.required ?? []);
    const fields = [];
    const prefix = 'f-' + call.id + '-';

    const form = h('form', { class: 'elicitation' },
                   h('p', { class: 'question' },
                     args.question ?? 'The agent asks:'));

    if (schema === null) {
        const ta = h('textarea', { id: prefix + 'answer', name: 'answer',
                                   rows: 2, required: true });
        form.append(h('label', { for: ta.id }, 'Your answer'), ta);
        fields.push({ name: null, el: ta, type: 'string' });
    } else {
        for (const [name, p] of Object.entries(schema.properties)) {
            const f = field(prefix + name, name, p, required.has(name));
            form.append(f.wrap);
            fields.push(f);
        }
    }

    const err = h('span', { class: 'error', role: 'alert' });
    const submit = h('button', { type: 'submit' }, 'Send answer');

    form.append(h('div', { class: 'row' }, submit, err));

    form.addEventListener('submit', async e => {
        e.preventDefault();

        let result = {};

        for (const f of fields) {
            const v = value(f);
            if (f.name === null) {
                result = v;
            } else if (v !== undefined) {
                result[f.name] = v;
            }
        }

        submit.disabled = true;
        try {
            const r = await conv.answer(call.id, result);
            say(r.stale ? 'That question no longer waits.' : 'Answered.');
        } catch (e) {
            err.textContent = e.message;
            submit.disabled = false;
        }
    });

    return form;
}

function field(id, name, p, required) {
    const label = (p.title ?? name) + (required ? ' *' : '');
    const type = Array.isArray(p.type) ? p.type[0] : p.type;
    const desc = p.description ? h('small', { id: id + '-d' }, p.description)
                               : null;
    const common = { id, name, required,
                     'aria-describedby': desc ? id + '-d' : null };
    let el;

    if (Array.isArray(p.enum)) {
        el = h('select', common,
               required ? null : h('option', { value: '' }, '—'),
               p.enum.map((v, i) => h('option', { value: i,
                                                  selected: v === p.default },
                                      String(v))));
        return { name, el, type: 'enum', values: p.enum,
                 wrap: h('div', { class: 'field' },
                         h('label', { for: id }, label), el, desc) };
    }

    if (type === 'boolean') {
        el = h('input', { id, name, type: 'checkbox',
                          checked: p.default === true,
                          'aria-describedby': common['aria-describedby'] });
        return { name, el, type,
                 wrap: h('div', { class: 'field check' }, el,
                         h('label', { for: id }, label), desc) };
    }

    if (type === 'number' || type === 'integer') {
        el = h('input', { ...common, type: 'number',
                          inputmode: type === 'integer' ? 'numeric'
                                                        : 'decimal',
                          step: type === 'integer' ? 1 : 'any',
                          min: p.minimum, max: p.maximum,
                          value: p.default });
    } else {
        el = h('input', { ...common, type: 'text', value: p.default,
                          minlength: p.minLength, maxlength: p.maxLength });
    }

    return { name, el, type,
             wrap: h('div', { class: 'field' },
                     h('label', { for: id }, label), el, desc) };
}

function value(f) {
    const v = f.el.value;

    switch (f.type) {
    case 'enum':
        return v === '' ? undefined : f.values[Number(v)];
    case 'boolean':
        return f.el.checked;
    case 'number':
    case 'integer':
        return v === '' ? undefined : Number(v);
    default:
        return v === '' && f.name !== null ? undefined : v;
    }
}

/* regenerate and edit: the log keeps the superseded branch, the page
 * drops it when the rewind event comes; tool calls that ran are not
 * undone */

async function regenerate() {
    try {
        await conv.regenerate();
        say('');
    } catch (err) {
        say('Not regenerated: ' + err.message);
    }
}

function editUser(item, li) {
    const area = h('textarea', { rows: 3 });
    area.value = item.content;

    const restore = () => {
        form.remove();
        li.querySelector('p').hidden = false;
        li.querySelector('.edit').hidden = false;
    };

    const form = h('form', { class: 'edit-form' }, area,
                   h('button', { type: 'submit' }, 'Send'),
                   h('button', { type: 'button', onclick: restore },
                     'Cancel'));

    form.addEventListener('submit', async e => {
        e.preventDefault();
        const text = area.value.trim();

        if (text === '') {
            return;
        }

        try {
            await conv.edit(item.seq, text);
            say('');
        } catch (err) {
            say('Not edited: ' + err.message);
            restore();
        }
    });

    li.querySelector('p').hidden = true;
    li.querySelector('.edit').hidden = true;
    li.append(form);
    area.focus();
}

/* the composer */

$('composer').addEventListener('submit', async e => {
    e.preventDefault();

    const input = $('input');
    const text = input.value.trim();

    if (text === '') {
        return;
    }

    $('send').disabled = true;
    try {
        const turn = conv.turn;
        const r = await conv.send(text);
        input.value = '';
        say(r.queued ? QUEUED : '');
        queuedAfter = r.queued ? turn : null;
        schedule();
    } catch (err) {
        say('Not sent: ' + err.message);
    } finally {
        $('send').disabled = false;
        input.focus();
    }
});

$('input').addEventListener('keydown', e => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        $('composer').requestSubmit();
    }
});

$('cancel').addEventListener('click', async () => {
    try {
        await conv.cancel();    /* the conversation says "Stopped." */
    } catch (err) {
        say('Could not stop: ' + err.message);
    }
});

$('new-conv').addEventListener('click', e => {
    e.preventDefault();
    location.hash = '';     /* hashchange: a new conversation */
});

window.addEventListener('hashchange', () => location.reload());

/*
 * The message box never covers what has the focus: the page scrolls with
 * a bottom padding of the box's height, and a control that takes the
 * focus, or a part of a card that opens, beneath the box is scrolled
 * above it.
 */

function keepAbove(el) {
    const r = el.getBoundingClientRect();
    const top = $('dock').getBoundingClientRect().top;

    if (r.bottom > top) {
        scrollBy(0, Math.min(r.bottom - top + 8, r.top - 8));
    }
}

new ResizeObserver(() => {
    document.documentElement.style.scrollPaddingBottom =
        $('dock').offsetHeight + 8 + 'px';
}).observe($('dock'));

document.addEventListener('focusin', e => {
    if (!$('dock').contains(e.target)) {
        keepAbove(e.target);
    }
});

document.addEventListener('toggle', e => {
    if (e.target.open && !$('dock').contains(e.target)) {
        keepAbove(e.target);
    }
}, true);

/* the tools' descriptions, for their cards' titles */
fetch('/assistant/describe')
    .then(r => r.ok ? r.json() : null)
    .then(d => {
        for (const t of d?.tools ?? []) {
            if (typeof t?.name === 'string'
                && typeof t.description === 'string')
            {
                described.set(t.name, t.description);
            }
        }
        schedule();
    })
    .catch(() => {});

$('conv-id').textContent = conv.id;
conv.addEventListener('change', schedule);
conv.connect();
render();
