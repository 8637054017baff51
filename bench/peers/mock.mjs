// The mock provider every server under test talks to: OpenAI Chat
// Completions, streamed the way api.openai.com streams it (the role
// chunk, the tool call's id and name, its arguments in 4 pieces, the
// finish chunk, the usage chunk when asked for, "data: [DONE]").
//
// A request whose last message is not a tool result gets the tool call
// (get_weather, {"city":"Paris"}); one whose last message is a tool
// result gets a 200-token reply.
//
//   node mock.mjs PORT trickle|burst
//
// trickle: each SSE frame written on its own, 1 ms apart; burst: the
// whole reply in one write.  GET /served: the requests answered so far.

import http from 'node:http';
import { randomBytes } from 'node:crypto';

const port = Number(process.argv[2] || 18000);
const pacing = process.argv[3] || 'trickle';

const TOKENS = 200;
const ARGUMENT_PIECES = ['{"ci', 'ty":"', 'Par', 'is"}'];

let served = 0;

function id(prefix, n) {
    return prefix + randomBytes(n).toString('base64url').slice(0, n);
}

function frames(req, tool) {
    const head = {
        id: id('chatcmpl-', 29),
        object: 'chat.completion.chunk',
        created: Math.floor(Date.now() / 1000),
        model: req.model || 'gpt-mock',
    };
    const usage = req.stream_options && req.stream_options.include_usage;
    const out = [];

    const chunk = (choices, u) => 'data: ' + JSON.stringify({
        ...head, service_tier: 'default', system_fingerprint: 'fp_mock',
        choices, ...(usage ? { usage: u ?? null } : {}),
    }) + '\n\n';

    const choice = (delta, finish = null) => chunk([{
        index: 0, delta, logprobs: null, finish_reason: finish,
    }]);

    if (tool) {
        out.push(choice({
            role: 'assistant', content: null, refusal: null,
            tool_calls: [{ index: 0, id: id('call_', 24), type: 'function',
                           function: { name: 'get_weather',
                                       arguments: '' } }],
        }));

        for (const a of ARGUMENT_PIECES) {
            out.push(choice({ tool_calls: [{ index: 0,
                                             function: { arguments: a } }] }));
        }

        out.push(choice({}, 'tool_calls'));

    } else {
        out.push(choice({ role: 'assistant', content: '', refusal: null }));

        for (let i = 1; i <= TOKENS; i++) {
            out.push(choice({ content: (i > 1 ? ' ' : '') + 'w' + i }));
        }

        out.push(choice({}, 'stop'));
    }

    if (usage) {
        const c = tool ? 5 : TOKENS;
        out.push(chunk([], {
            prompt_tokens: 50, completion_tokens: c, total_tokens: 50 + c,
            prompt_tokens_details: { cached_tokens: 0, audio_tokens: 0 },
            completion_tokens_details: {
                reasoning_tokens: 0, audio_tokens: 0,
                accepted_prediction_tokens: 0,
                rejected_prediction_tokens: 0,
            },
        }));
    }

    out.push('data: [DONE]\n\n');
    return out;
}

function reply(res, body) {
    let req;

    try {
        req = JSON.parse(body);
    } catch {
        res.writeHead(400, { 'Content-Type': 'application/json' });
        res.end('{"error":{"message":"bad JSON"}}');
        return;
    }

    const msgs = req.messages || [];
    const last = msgs[msgs.length - 1] || {};
    const out = frames(req, last.role !== 'tool');

    served++;

    res.writeHead(200, {
        'Content-Type': 'text/event-stream; charset=utf-8',
        'openai-version': '2020-10-01',
        'x-request-id': id('req_', 32),
    });

    if (pacing === 'burst') {
        res.end(out.join(''));
        return;
    }

    let i = 0;

    const next = () => {
        res.write(out[i++]);

        if (i === out.length) {
            res.end();
            return;
        }

        setTimeout(next, 1);
    };

    next();
}

const server = http.createServer((req, res) => {
    if (req.method === 'GET' && req.url === '/served') {
        res.writeHead(200, { 'Content-Type': 'application/json' });
        res.end(JSON.stringify({ served }));
        return;
    }

    if (req.method !== 'POST' || !req.url.endsWith('/chat/completions')) {
        res.writeHead(404);
        res.end();
        return;
    }

    const parts = [];
    req.on('data', (d) => parts.push(d));
    req.on('end', () => reply(res, Buffer.concat(parts).toString()));
});

server.keepAliveTimeout = 60000;
server.listen(port, '127.0.0.1', () => {
    process.stdout.write(`mock listening on ${port}, ${pacing}\n`);
});
