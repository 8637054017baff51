/*
 * The demo page of nginx.conf.example in a real browser: every executor,
 * a cancel, and a reload in the middle of a reply, at a desktop's width
 * (1280x800) and a phone's (390x844), checked as a user sees them: the
 * text shown, what is at a point of the window.  Run by t/browser.t:
 *
 *     node demo.mjs BASE_URL SCREENSHOT_DIR
 *
 * Its waits are for t/browser.t's demo provider, twice as fast as that
 * of `./run demo` (DEMO_PROVIDER_DELAY=0.02): against the latter the
 * network loss's story outlasts the wait for its end.
 *
 * Prints one line per check, "ok - name" or "not ok - name: why", and
 * "screenshot PATH" for each screenshot.
 */

import net from 'node:net';
import { chromium } from 'playwright-core';

const [base, shots] = process.argv.slice(2);
const executable = process.env.CHROMIUM ?? '/usr/bin/chromium';
const TZ = 'Pacific/Auckland';

let failed = 0;
let step = 0;

function ok(cond, name, why = '') {
    if (!cond) {
        failed++;
    }
    console.log(`${cond ? 'ok' : 'not ok'} - ${name}`
                + (cond || !why ? '' : `: ${why}`));
    return cond;
}

/* the whole page, or with window, what the window shows */
async function shot(page, name, window = false) {
    const path = `${shots}/${String(++step).padStart(2, '0')}-${name}.png`;
    await page.screenshot({ path, fullPage: !window });
    console.log(`screenshot ${path}`);
}

async function check(name, fn) {
    try {
        await fn();
    } catch (e) {
        ok(false, name, String(e.message).split('\n')[0]);
    }
}

async function inspect(id) {
    const r = await fetch(`${base}/chat/${id}?limit=1000`);
    return r.json();
}

const browser = await chromium.launch({
    executablePath: executable,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic',
           '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync',
           '--disable-dev-shm-usage']
});

const DESKTOP = { width: 1280, height: 800 };
const PHONE = { width: 390, height: 844 };
const context = await browser.newContext({ timezoneId: TZ,
                                           viewport: DESKTOP });
const errors = [];
const missing = [];          /* the main page's 404s */
const page = await context.newPage();
let id = null;

page.on('response', r => {
    if (r.status() === 404) {
        missing.push(r.url());
    }
});

page.on('pageerror', e => errors.push(String(e)));
page.on('console', m => {
    /* the event stream of a conversation not made yet answers 404 */
    if (m.type() === 'error' && !m.text().startsWith('Failed to load')) {
        errors.push(m.text());
    }
});

page.setDefaultTimeout(15000);

const log = page.locator('#log');
const lastAssistant = () => log.locator('li.assistant:not([hidden])').last();
const lastTool = name => log.locator(`li.tool[data-name="${name}"]`).last();

/* the turn before the message last sent: its own turn is the next */
let sentAfter = 0;

async function send(text) {
    sentAfter = await page.evaluate(() => window.conversation?.turn ?? 0);
    await page.fill('#input', text);
    await page.keyboard.press('Enter');
}

/* the reply of the turn just sent: done when that turn has started, the
 * state is idle and the last assistant item is complete (right after a
 * send the state is still the idle of the turn before) */
async function waitIdle() {
    await page.waitForFunction(after => {
        const c = window.conversation;
        /* and the page shows it: it renders on the next frame */
        return c && c.turn > after && c.state === 'idle'
               && c.streaming === null
               && document.body.dataset.state === 'idle'
               && document.body.dataset.lastSeq === String(c.lastSeq);
    }, sentAfter);
}

/* the element at the center of a control, as a click there finds it */
async function atCenter(loc) {
    return loc.evaluate(el => {
        const r = el.getBoundingClientRect();
        const at = document.elementFromPoint(r.left + r.width / 2,
                                             r.top + r.height / 2);
        return { free: at === el || el.contains(at),
                 at: at ? at.tagName + '#' + at.id + '.' + at.className
                        : 'nothing',
                 inView: r.top >= 0 && r.bottom <= innerHeight };
    });
}

await check('a new conversation is ready', async () => {
    await page.goto(`${base}/`);
    await page.waitForFunction(() => window.conversation);
    id = await page.evaluate(() => window.conversation.id);
    ok(/^web-/.test(id) && page.url().endsWith('#c=' + id),
       'a new id in the address', page.url());

    /* long enough for retries, had there been any */
    await page.waitForTimeout(2500);
    const conn = page.locator('#conn');
    ok(await conn.textContent() === 'ready', 'it says ready',
       await conn.textContent());
    ok(await conn.evaluate(el => getComputedStyle(el).color)
       !== 'rgb(138, 90, 0)', 'not in amber');
    ok(missing.length === 0, 'no 404 before the first message',
       missing.join(' '));

    const icon = await page.locator('link[rel="icon"]').getAttribute('href');
    ok(icon?.startsWith('data:image/svg+xml'), 'an icon in the page');
    await shot(page, 'new-conversation');
});

await check('text streams in, thinking folded', async () => {
    await send('hello there');

    /* samples of the reply while it streams */
    const seen = [];
    await page.waitForSelector('li.assistant.streaming');
    for (let i = 0; i < 200; i++) {
        const s = await page.evaluate(() => {
            const el = [...document.querySelectorAll('li.assistant')].pop();
            return el ? { text: el.querySelector('.text').textContent,
                          streaming: el.classList.contains('streaming') }
                      : null;
        });
        if (s) {
            seen.push(s);
            if (!s.streaming) {
                break;
            }
        }
        await page.waitForTimeout(50);
    }

    const final = seen[seen.length - 1]?.text ?? '';
    const partial = seen.filter(s => s.streaming && s.text.length > 0
                                     && s.text.length < final.length);

    ok(final.startsWith('You said: "hello there"'), 'the reply arrives',
       final);
    ok(await page.locator('#conn').textContent() === 'connected',
       'connected once the first message is sent');
    ok(partial.length >= 2, 'seen in parts while it streams',
       `${partial.length} partial samples`);
    ok(partial.every(s => final.startsWith(s.text)),
       'each part a prefix of the reply');

    const think = lastAssistant().locator('details.thinking');
    ok(await think.isVisible() && !(await think.getAttribute('open')),
       'thinking shown collapsed');
    ok((await think.textContent()).includes('no model behind me'),
       'thinking holds the model\'s thinking');
    await shot(page, 'streamed-text');
});

await check('a server tool', async () => {
    await send('what time is it?');
    await waitIdle();
    const card = lastTool('get_time');
    ok(await card.getAttribute('data-status') === 'done', 'get_time done');
    ok(await card.locator('.tool-name').innerText()
       === 'The current time on the server',
       'the card says what the tool does',
       await card.locator('.tool-name').innerText());
    ok(await card.locator('.tool-result dt').innerText() === 'time'
       && /^\d{4}-\d\d-\d\dT/.test(
           await card.locator('.tool-result dd').innerText()),
       'its result as a name and a value',
       await card.locator('.tool-result').innerText());
    const json = card.locator('details.tool-json');
    ok(!(await json.locator('pre').isVisible()), 'its JSON folded away');
    await json.locator('summary').click();
    ok(await json.locator('pre').isVisible()
       && JSON.parse(await json.locator('pre').innerText()).result?.time,
       'the JSON one click away');
    ok((await lastAssistant().textContent()).includes("server's clock"),
       'the reply uses it');
});

await check('the provider searched the web', async () => {
    await send('look it up on the web');
    await waitIdle();
    const card = lastTool('web_search');
    ok(await card.getAttribute('data-status') === 'done', 'search done');
    ok(await card.evaluate(el => el.classList.contains('hosted')),
       'a card of its own');
    const head = await card.locator('.tool-name').textContent();
    ok(head === 'Searched the web for \u201cnginx documentation\u201d',
       'says what it searched for', head);
    const link = card.locator('.sources a');
    ok(await link.count() === 1
       && await link.getAttribute('href') === 'https://nginx.org/en/docs/',
       'the page it found, as a link');
    ok((await lastAssistant().textContent()).includes('nginx.org'),
       'the reply uses it');
    ok(await card.evaluate(el => {
        const a = [...document.querySelectorAll('li.assistant')].pop();
        return (el.compareDocumentPosition(a)
                & Node.DOCUMENT_POSITION_FOLLOWING) !== 0;
    }), 'above the reply, as it came first');
    await shot(page, 'web-search');
});

await check('a streaming tool shows progress', async () => {
    await send('search the docs');
    await page.waitForSelector('li.tool[data-name="search_docs"]');
    const card = lastTool('search_docs');

    /* what the card shows while the tool runs */
    const seen = [];
    for (let i = 0; i < 200; i++) {
        const s = await card.evaluate(el => ({
            doing: el.querySelector('.tool-progress:not([hidden]) span')
                     ?.textContent ?? null,
            done: !el.querySelector('.tool-result').hidden
        }));
        if (s.done) {
            break;
        }
        if (s.doing !== null && seen[seen.length - 1] !== s.doing) {
            seen.push(s.doing);
            /* a screenshot can take longer than a step: taken once two
               steps are seen, so it never hides the second */
            if (seen.length === 2) {
                await shot(page, 'tool-progress-running', true);
            }
        }
        await page.waitForTimeout(50);
    }
    ok(seen.length >= 2, 'its progress shown step by step, as it comes',
       JSON.stringify(seen));
    await waitIdle();

    ok(await card.locator('.tool-name').innerText()
       === 'Search the documentation', 'titled by its description');
    ok(await card.locator('.tool-args dt').innerText() === 'query'
       && await card.locator('.tool-args dd').innerText()
          === 'search the docs', 'its arguments as names and values');
    const prog = card.locator('.tool-progress');
    ok(await prog.isVisible(), 'progress shown');
    ok((await prog.textContent()).includes('ranking'), 'the last progress');
    ok(await prog.locator('progress').getAttribute('max') === '3',
       'progress as a bar');
    ok((await card.locator('.tool-result').textContent())
       .includes('docs/api.md'), 'then the result');
    await shot(page, 'tool-progress');
});

await check('approve, from the keyboard', async () => {
    await send('leave a note please');
    const card = lastTool('send_note');
    await card.locator('.approval').waitFor();
    await shot(page, 'approval-card');

    /* the card takes the focus: Enter approves */
    await page.waitForFunction(() =>
        document.activeElement?.classList.contains('approve'));
    ok(true, 'the approval card takes the focus');
    await page.keyboard.press('Enter');
    await waitIdle();
    ok(await card.getAttribute('data-status') === 'done', 'approved: it ran');
    ok(await card.locator('.approval').count() === 0, 'the card is gone');
    ok((await lastAssistant().textContent()).includes('Your note was saved'),
       'the reply says so');
});

await check('reject with a reason', async () => {
    await send('another note');
    const card = lastTool('send_note');
    await card.locator('.approval').waitFor();
    await card.locator('input.reason').fill('not today');
    await card.locator('button.reject').click();
    await waitIdle();
    ok(await card.getAttribute('data-status') === 'error',
       'rejected: an error result');
    ok((await card.locator('.tool-result').textContent())
       .includes('denied by approver: not today'), 'with the reason');
});

await check('approve edited arguments', async () => {
    await send('a third note');
    const card = lastTool('send_note');
    await card.locator('.approval').waitFor();
    await card.locator('details.edit summary').click();
    await card.locator('textarea.edit-args').fill('{"text":"edited by me"}');
    await card.locator('button.approve-edited').click();
    await waitIdle();
    ok(await card.getAttribute('data-status') === 'done', 'it ran');
    ok((await card.locator('.tool-args').innerText())
       .includes('edited by me'), 'with the edited arguments');

    const conv = await inspect(id);
    const r = conv.messages.filter(m => m.type === 'resolution').pop();
    ok(r?.args?.text === 'edited by me', 'recorded as an edit');
});

await check('a form from a JSON Schema', async () => {
    await send('book a table');
    const card = lastTool('ask_user');
    const form = card.locator('form.elicitation');
    await form.waitFor();

    ok(await form.locator('input[type="text"][name="name"][required]')
       .count() === 1, 'a required string');
    ok(await form.locator('input[type="number"][name="guests"]')
       .inputValue() === '2', 'a number with its default');
    ok(await form.locator('select[name="time"] option').count() === 3,
       'an enum as a select');
    ok(await form.locator('input[type="checkbox"][name="terrace"]')
       .count() === 1, 'a boolean as a checkbox');

    /* required: the browser keeps an empty name from being sent */
    await form.locator('input[name="name"]').fill('');
    await form.locator('button[type="submit"]').click();
    await page.waitForTimeout(300);
    ok(await card.getAttribute('data-status') === 'waiting',
       'an empty required field is not sent');
    await shot(page, 'elicitation-form');
    await page.screenshot({ path: `${shots}/demo.png` });

    await form.locator('input[name="name"]').fill('Ada');
    await form.locator('input[name="guests"]').fill('4');
    await form.locator('select[name="time"]').selectOption({ label: '20:00' });
    await form.locator('input[name="terrace"]').check();
    await form.locator('button[type="submit"]').click();
    await waitIdle();

    ok(await card.locator('.tool-name').innerText()
       === 'Ask the user a question and wait for the answer',
       'the form titled by the tool\'s description');
    ok((await card.locator('.tool-result').innerText()).includes('Ada'),
       'the answer shown');
    const res = JSON.parse(await card.locator('.tool-json pre')
                           .textContent()).result;
    ok(res.name === 'Ada' && res.guests === 4 && res.time === '20:00'
       && res.terrace === true && !('notes' in res),
       'the answer typed as the schema says', JSON.stringify(res));
});

await check('a single question', async () => {
    await send('ask me something');
    const card = lastTool('ask_user');
    await card.locator('form.elicitation textarea').fill('green');
    await card.locator('form.elicitation button[type="submit"]').click();
    await waitIdle();
    ok((await lastAssistant().textContent()).includes('You answered: "green"'),
       'the answer reaches the model');
});

await check('a client tool runs in the page', async () => {
    /* a second tab on the same conversation runs it too; the one that
     * loses gets a quiet 409 */
    const other = await context.newPage();
    other.on('pageerror', e => errors.push(String(e)));
    await other.goto(`${base}/#c=${id}`);
    await other.waitForFunction(() => window.conversation?.connected);

    await send('what is my timezone?');
    await waitIdle();
    const card = lastTool('browser_timezone');
    ok(await card.getAttribute('data-status') === 'done', 'it ran');
    ok((await lastAssistant().textContent()).includes(TZ),
       'with the browser\'s time zone', await lastAssistant().textContent());

    const conv = await inspect(id);
    const rs = conv.messages.filter(m => m.type === 'resolution'
                                         && m.kind === 'client_exec');
    ok(rs.length === 1 && rs[0].source === 'client',
       'resolved once, by a client');
    await other.close();
});

await check('cancel mid-reply', async () => {
    await send('tell me a story');
    await page.waitForFunction(() =>
        window.conversation?.streaming?.text.length > 20);
    await page.click('#cancel');
    await waitIdle();
    const a = lastAssistant();
    ok(await a.getAttribute('data-status') === 'cancelled',
       'the partial reply is kept, marked cancelled');
    ok(await log.locator('li.notice.cancelled').count() === 1,
       'the turn says it stopped');
    const said = await page.evaluate(() => document.body.innerText);
    ok(said.split('Stopped.').length === 2, '"Stopped." shown once',
       `${said.split('Stopped.').length - 1} times`);
    ok(await page.locator('#cancel').isDisabled(), 'nothing left to stop');
    await shot(page, 'cancelled');
});

await check('a message sent during a reply is queued, then runs', async () => {
    await send('tell me a story');
    await page.waitForFunction(() =>
        window.conversation?.streaming?.text.length > 20);
    sentAfter = await page.evaluate(() => window.conversation.turn);
    await page.fill('#input', 'hello once more');
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => document.getElementById('status')
                               .textContent.startsWith('Queued'));
    ok(true, 'the page says it is queued');
    await page.click('#cancel');
    await waitIdle();
    ok((await lastAssistant().textContent())
       .includes('You said: "hello once more"'), 'it ran');
    const said = await page.locator('#status').textContent();
    ok(!said.startsWith('Queued'), 'and the page says it waits no more',
       said);
});

await check('reload mid-reply: nothing lost or doubled', async () => {
    await send('another story');
    await page.waitForFunction(() =>
        window.conversation?.streaming?.text.length > 40);

    await page.reload();

    /* the page catches up: the reply so far, then the rest */
    await page.waitForFunction(() =>
        window.conversation?.streaming?.text.length > 0);
    const samples = [];
    while (true) {
        const s = await page.evaluate(() => ({
            text: window.conversation.streaming?.text ?? null,
            state: window.conversation.state
        }));
        if (s.text === null) {
            break;
        }
        samples.push(s.text);
        await page.waitForTimeout(100);
    }
    await waitIdle();
    await shot(page, 'reloaded');

    const conv = await inspect(id);
    const logged = conv.messages.filter(m => m.type === 'assistant_msg'
                                             && m.content !== '');
    const last = logged[logged.length - 1];

    ok(samples.length > 1 && samples.every(t => last.content.startsWith(t)),
       'after the reload, each part a prefix of the reply');

    const shown = await page.evaluate(() =>
        [...document.querySelectorAll('li.assistant:not([hidden]) .text')]
            .map(e => e.textContent));
    ok(JSON.stringify(shown)
       === JSON.stringify(logged.map(m => m.content)),
       'every reply shown once, as logged',
       `${shown.length} shown, ${logged.length} logged`);

    const users = await log.locator('li.user').count();
    ok(users === conv.messages.filter(m => m.type === 'user_msg').length,
       'every message shown once');
});

/*
 * A network loss mid-reply: the page talks to nginx through a TCP proxy
 * of ours, which drops every connection and refuses new ones for a
 * while; the page reconnects by itself and catches up.
 */

function proxy(target) {
    const socks = new Set();
    const server = net.createServer(c => {
        const u = net.connect(target.port, target.hostname);
        socks.add(c);
        socks.add(u);
        c.pipe(u);
        u.pipe(c);
        for (const s of [c, u]) {
            s.on('error', () => {});
            s.on('close', () => { socks.delete(s); c.destroy(); u.destroy(); });
        }
    });
    return {
        listen: port => new Promise(r => server.listen(port, '127.0.0.1',
                                                       () => r(server.address().port))),
        cut: () => new Promise(r => {
            server.close(() => r());
            for (const s of socks) {
                s.destroy();
            }
        })
    };
}

await check('a network loss mid-reply: the page reconnects, catches up',
            async () => {
    const target = new URL(base);
    let p = proxy(target);
    const port = await p.listen(0);
    const lossId = id + '-loss';
    const far = await context.newPage();
    far.on('pageerror', e => errors.push(String(e)));
    far.setDefaultTimeout(20000);

    /* a conversation not made yet has no event stream: not connected */
    await far.goto(`http://127.0.0.1:${port}/#c=${lossId}`);
    await far.waitForFunction(() => window.conversation);

    await far.fill('#input', 'tell me a story');
    await far.keyboard.press('Enter');
    await far.waitForFunction(() =>
        window.conversation?.streaming?.text.length > 40);
    ok(true, 'the reply streams through the proxy');

    await p.cut();
    await far.waitForFunction(() => !window.conversation.connected);
    ok(true, 'the page sees the loss');
    await far.waitForTimeout(1500);

    p = proxy(target);
    await p.listen(port);
    await far.waitForFunction(() => window.conversation.connected);
    ok(true, 'the page reconnects');

    await far.waitForFunction(() => {
        const c = window.conversation;
        return c.connected && c.state === 'idle' && c.streaming === null
               && c.turn > 0;
    });
    await shot(far, 'reconnected');

    const conv = await inspect(lossId);
    const logged = conv.messages.filter(m => m.type === 'assistant_msg'
                                             && m.content !== '');
    const shown = await far.evaluate(() =>
        [...document.querySelectorAll('li.assistant:not([hidden]) .text')]
            .map(e => e.textContent));

    ok(logged.length > 0 && JSON.stringify(shown)
       === JSON.stringify(logged.map(m => m.content)),
       'after the loss, every reply shown once, as logged',
       `${shown.length} shown, ${logged.length} logged`);

    await far.close();
    await p.cut();
});

/* a reply in markdown, and one that tries to be HTML */
async function markdownChecks(label) {
    await send('show me markdown');
    await waitIdle();
    const text = lastAssistant().locator('.text');
    ok(await text.locator('ul > li').count() === 2
       && await text.locator('ol > li').count() === 2, `${label}lists`);
    ok(await text.locator('strong').first().innerText() === 'markdown'
       && await text.locator('em').first().innerText() === 'emphasis',
       `${label}strong and emphasis`);
    ok((await text.locator('pre code').innerText()).startsWith('curl -N'),
       `${label}a code block`);
    ok(await text.locator('a[href="https://nginx.org/"]').innerText()
       === 'nginx.org', `${label}a link`);
    ok((await text.innerText()).includes('<b>this</b> stays text'),
       `${label}HTML in it shown as text`);
    ok(!(await text.innerText()).includes('**'), `${label}no markup shown`);
    await shot(page, label ? 'markdown-phone' : 'markdown', true);
}

await check('markdown', () => markdownChecks(''));

await check('model text cannot make HTML', async () => {
    await send('hi <img src=x onerror="window.pwned=1"> '
               + '[x](javascript:window.pwned=2) *fine*');
    await waitIdle();
    await page.waitForTimeout(300);
    const text = lastAssistant().locator('.text');
    ok(await page.locator('#log img').count() === 0, 'no <img> in the page');
    ok(await page.evaluate(() => window.pwned === undefined),
       'no script of it ran');
    ok(await page.locator('#log a[href^="javascript"]').count() === 0,
       'no javascript: link');
    const shown = await text.innerText();
    ok(shown.includes('<img src=x onerror="window.pwned=1">'),
       'the tag shown as the text it is', shown);
    ok(await text.locator('em').innerText() === 'fine',
       'the rest rendered');
});

/* what has the focus is never under the message box: the approval
 * card's "Approve with these arguments", opened and reached from the
 * keyboard, then clicked where it is seen */
async function approveEdited(label) {
    await send(`a note from ${label}`);
    const card = lastTool('send_note');
    await card.locator('.approval').waitFor();
    await page.waitForFunction(() =>
        document.activeElement?.classList.contains('approve'));

    await card.locator('details.edit summary').focus();
    await page.keyboard.press('Enter');
    await card.locator('textarea.edit-args').waitFor();
    await card.locator('textarea.edit-args').focus();
    await page.keyboard.press('Tab');

    const button = card.locator('button.approve-edited');
    ok(await button.evaluate(el => el === document.activeElement),
       `${label}: the button takes the focus`);
    await page.waitForTimeout(200);
    const at = await atCenter(button);
    ok(at.free && at.inView,
       `${label}: nothing covers the focused button`, at.at);
    await shot(page, `focused-button-${label}`, true);

    const box = await button.boundingBox();
    await page.mouse.click(box.x + box.width / 2, box.y + box.height / 2);
    await waitIdle();
    ok(await card.getAttribute('data-status') === 'done',
       `${label}: a click there approves`);
}

/* the contrast of an element's text with what is behind it (WCAG's
 * ratio, 1 to 21), the background taken from the nearest element that
 * has one, a translucent one laid over what is behind it */
async function contrast(loc) {
    return loc.evaluate(el => {
        const rgba = c => {
            const m = c.match(/[\d.]+/g).map(Number);
            return { r: m[0], g: m[1], b: m[2], a: m.length > 3 ? m[3] : 1 };
        };
        const over = (top, under) => ({
            r: top.r * top.a + under.r * (1 - top.a),
            g: top.g * top.a + under.g * (1 - top.a),
            b: top.b * top.a + under.b * (1 - top.a), a: 1
        });
        const lum = c => ['r', 'g', 'b'].map((k, i) => {
            const v = c[k] / 255;
            return [0.2126, 0.7152, 0.0722][i]
                   * (v <= 0.03928 ? v / 12.92
                                   : ((v + 0.055) / 1.055) ** 2.4);
        }).reduce((a, b) => a + b);

        const layers = [];
        for (let e = el; e; e = e.parentElement) {
            const c = rgba(getComputedStyle(e).backgroundColor);
            if (c.a > 0) {
                layers.push(c);
            }
            if (c.a === 1) {
                break;
            }
        }
        const bg = layers.reduceRight((under, top) => over(top, under),
                                      { r: 255, g: 255, b: 255, a: 1 });
        const fg = over(rgba(getComputedStyle(el).color), bg);
        const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);

        return Math.round((hi + 0.05) / (lo + 0.05) * 10) / 10;
    });
}

/* the log's current branch: an event is superseded when a later rewind
 * goes to before it */
function branchOf(messages) {
    let to = Infinity;
    const keep = [];

    for (const m of [...messages].reverse()) {
        if (m.seq > to) {
            continue;
        }
        keep.unshift(m);
        if (m.type === 'rewind') {
            to = Math.min(to, m.to_seq);
        }
    }

    return keep;
}

/* what the page shows of a kind of message, and the branch's */
async function shownAndLogged() {
    const conv = await inspect(id);
    const branch = branchOf(conv.messages);
    const shown = await page.evaluate(() => ({
        user: [...document.querySelectorAll('li.user > p')]
            .map(e => e.textContent),
        assistant: [...document.querySelectorAll(
            'li.assistant:not([hidden]) .text')].map(e => e.textContent)
    }));

    return {
        conv, shown,
        user: branch.filter(m => m.type === 'user_msg').map(m => m.content),
        assistant: branch.filter(m => m.type === 'assistant_msg'
                                      && m.content !== '')
            .map(m => m.content)
    };
}

/* the page's user messages are the branch's, and its replies as many,
 * the last the same (a reply's markdown is shown rendered) */
function same(now) {
    return JSON.stringify(now.shown.user) === JSON.stringify(now.user)
           && now.shown.assistant.length === now.assistant.length
           && now.shown.assistant.at(-1) === now.assistant.at(-1);
}

await check('regenerate the last reply, edit a message', async () => {
    await send('hello again');
    await waitIdle();

    const before = await shownAndLogged();
    const button = lastAssistant().locator('button.regenerate');
    ok(await button.isVisible(), 'the last reply has a regenerate button');
    ok(await log.locator('button.regenerate:visible').count() === 1,
       'only the last reply has one');

    sentAfter = await page.evaluate(() => window.conversation.turn);
    await button.click();
    await waitIdle();

    let now = await shownAndLogged();
    ok(now.conv.messages.some(m => m.type === 'rewind'),
       'regenerate: the log has a rewind');
    ok(same(now), 'regenerate: the page shows the current branch',
       JSON.stringify(now.shown.user));
    ok(now.shown.assistant.length === before.shown.assistant.length,
       'regenerate: the old reply replaced, not added to');
    await shot(page, 'regenerated');

    const user = log.locator('li.user').last();
    let c = await contrast(user.locator('button.edit'));
    ok(c >= 4.5, 'edit: the Edit button readable on the message', `${c}:1`);
    sentAfter = await page.evaluate(() => window.conversation.turn);
    await user.locator('button.edit').click();
    ok(await user.locator('textarea').inputValue() === 'hello again',
       'edit: the message\'s text to edit');
    for (const what of ['textarea', '.edit-form button[type=submit]',
                        '.edit-form button[type=button]'])
    {
        c = await contrast(user.locator(what));
        ok(c >= 4.5, `edit: ${what} readable`, `${c}:1`);
    }
    await shot(page, 'editing', true);
    await user.locator('textarea').fill('hello, edited');
    await user.locator('.edit-form button[type=submit]').click();
    await waitIdle();

    now = await shownAndLogged();
    ok(now.shown.user.at(-1) === 'hello, edited'
       && !now.shown.user.includes('hello again'),
       'edit: the page shows the new text, the old one gone',
       JSON.stringify(now.shown.user));
    ok(same(now), 'edit: the page shows the current branch');
    ok(now.conv.messages.filter(m => m.type === 'user_msg'
                                     && m.content === 'hello again')
       .length === 2, 'the log keeps the superseded messages');
    await shot(page, 'edited');
});

await check('the focused control, at a desktop\'s width',
            () => approveEdited('desktop'));

await check('a phone\'s width', async () => {
    await page.setViewportSize(PHONE);
    await send('note from my phone');
    await lastTool('send_note').locator('.approval').waitFor();
    const wide = await page.evaluate(() =>
        document.documentElement.scrollWidth);
    ok(wide <= PHONE.width, 'no sideways scrolling', `${wide}px wide`);
    await shot(page, 'phone');
    await lastTool('send_note').locator('button.approve').click();
    await waitIdle();
    await approveEdited('phone');
    await markdownChecks('phone: ');
    const at = await atCenter(page.locator('#send'));
    ok(at.free, 'phone: the send button clear', at.at);
});

await check('a new conversation at a phone\'s width', async () => {
    const before = missing.length;
    await page.goto(`${base}/`);
    await page.waitForTimeout(1500);
    ok(await page.locator('#conn').textContent() === 'ready',
       'phone: it says ready');
    ok(missing.length === before, 'phone: no 404',
       missing.slice(before).join(' '));
    await shot(page, 'new-conversation-phone');
});

ok(errors.length === 0, 'no errors in the page', errors.join('; '));

await browser.close();
process.exit(failed ? 1 : 0);
