/*
 * markdown.js: the little markdown a model writes, as DOM nodes.  No
 * dependencies; an ES module.
 *
 *     import { markdown } from './markdown.js';
 *     el.replaceChildren(markdown(text));
 *
 * Paragraphs, headings, fenced code blocks, lists (- * + or 1.), and
 * inline code, **strong**, *emphasis* and [links](https://...).  It
 * builds elements and text nodes, never HTML from the text, so what a
 * model writes can only ever show as text; a link is made only for an
 * http or https address, any other (javascript:, data:...) is its text.
 */

const FENCE = /^\s{0,3}(```|~~~)/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;

const INLINE = new RegExp([
    '(`+)([^`]|[^`][\\s\\S]*?[^`])\\1(?!`)',          /* 1, 2: code */
    '\\*\\*(?=\\S)([\\s\\S]*?\\S)\\*\\*',             /* 3: strong */
    '__(?=\\S)([\\s\\S]*?\\S)__(?!\\w)',              /* 4: strong */
    '\\*(?=[^\\s*])([\\s\\S]*?[^\\s*])\\*',           /* 5: emphasis */
    '(?<!\\w)_(?=[^\\s_])([\\s\\S]*?[^\\s_])_(?!\\w)', /* 6: emphasis */
    '\\[([^\\]\\n]+)\\]\\(\\s*((?:[^()\\s]|\\([^()\\s]*\\))+)\\s*\\)'
                                                      /* 7, 8: link */
].join('|'), 'g');

function el(tag, ...kids) {
    const e = document.createElement(tag);
    e.append(...kids);
    return e;
}

export function safeUrl(url) {
    return /^https?:\/\/[^\s]+$/i.test(url) ? url : null;
}

export function inline(text) {
    const re = new RegExp(INLINE);     /* its own lastIndex: recursive */
    const out = [];
    let at = 0;
    let m;

    while ((m = re.exec(text)) !== null) {
        if (m.index > at) {
            out.push(document.createTextNode(text.slice(at, m.index)));
        }
        at = re.lastIndex;

        if (m[2] !== undefined) {
            out.push(el('code', m[2]));
        } else if (m[3] !== undefined || m[4] !== undefined) {
            out.push(el('strong', ...inline(m[3] ?? m[4])));
        } else if (m[5] !== undefined || m[6] !== undefined) {
            out.push(el('em', ...inline(m[5] ?? m[6])));
        } else {
            const href = safeUrl(m[8]);

            if (href === null) {
                out.push(...inline(m[7]));
            } else {
                const a = el('a', ...inline(m[7]));
                a.href = href;
                a.target = '_blank';
                a.rel = 'noopener noreferrer nofollow';
                out.push(a);
            }
        }
    }

    if (at < text.length) {
        out.push(document.createTextNode(text.slice(at)));
    }

    return out;
}

/* a list from lines[i] on: its items, each with the lines that continue
 * it (indented ones); returns [element, next index] */
function list(lines, i) {
    const first = lines[i].match(ITEM);
    const ordered = /\d/.test(first[2]);
    const indent = first[1].length;
    const l = el(ordered ? 'ol' : 'ul');
    let item = null;

    if (ordered && parseInt(first[2], 10) !== 1) {
        l.start = parseInt(first[2], 10);
    }

    for (; i < lines.length; i++) {
        const line = lines[i];
        const m = line.match(ITEM);

        if (m && m[1].length === indent && /\d/.test(m[2]) === ordered) {
            item = { text: [m[3]] };
            l.append(el('li'));
            l.lastChild.md = item;
        } else if (m && m[1].length > indent) {
            item.text.push(line);
        } else if (line.trim() !== '' && /^\s/.test(line)) {
            item.text.push(line.trim());
        } else {
            break;
        }
    }

    for (const li of l.children) {
        const [head, ...rest] = li.md.text;
        const nested = rest.findIndex(t => ITEM.test(t));

        if (nested < 0) {
            li.append(...inline([head, ...rest].join('\n')));
        } else {
            li.append(...inline([head, ...rest.slice(0, nested)].join('\n')));
            li.append(blocks(dedent(rest.slice(nested))));
        }
        delete li.md;
    }

    return [l, i];
}

function dedent(lines) {
    const n = Math.min(...lines.filter(l => l.trim() !== '')
                               .map(l => l.match(/^\s*/)[0].length));
    return lines.map(l => l.slice(n));
}

function blocks(lines) {
    const out = document.createDocumentFragment();
    let para = [];

    const flush = () => {
        if (para.length > 0) {
            out.append(el('p', ...inline(para.join('\n'))));
            para = [];
        }
    };

    for (let i = 0; i < lines.length; ) {
        const line = lines[i];
        let m;

        if ((m = line.match(FENCE)) !== null) {
            const code = [];

            flush();
            for (i++; i < lines.length && !lines[i].trim().startsWith(m[1]);
                 i++)
            {
                code.push(lines[i]);
            }
            i++;
            out.append(el('pre', el('code', code.join('\n'))));

        } else if ((m = line.match(HEADING)) !== null) {
            flush();
            out.append(el('h' + Math.min(m[1].length + 2, 6),
                          ...inline(m[2])));
            i++;

        } else if (ITEM.test(line) && (para.length === 0
                                       || /^\s*([-*+]|1[.)])\s/.test(line)))
        {
            let l;

            flush();
            [l, i] = list(lines, i);
            out.append(l);

        } else if (line.trim() === '') {
            flush();
            i++;

        } else {
            para.push(line);
            i++;
        }
    }

    flush();
    return out;
}

export function markdown(text) {
    return blocks(String(text ?? '').replace(/\r\n?/g, '\n').split('\n'));
}
