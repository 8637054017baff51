// The AI SDK's own chat client (the "ai" package's AbstractChat, which
// useChat wraps, with its DefaultChatTransport), unmodified, against an
// agent_aisdk location.  Every chunk is checked against the package's
// uiMessageChunkSchema by the transport; a chunk that does not match
// ends the request with an error.
//
//   node aisdk.mjs URL CHAT_ID send TEXT    a message, its reply streamed
//   node aisdk.mjs URL CHAT_ID resume       useChat({ resume: true })
//
// Environment:
//   AISDK_PKG      the package: ai (5.x, the default), ai6, ai7
//   AISDK_TOOLS    {"tool name": output}: client tools (and answers to a
//                  person's question), run by onToolCall with addToolOutput
//   AISDK_APPROVE  "yes", or "no" or "no:REASON": the answer to every
//                  approval request (addToolApprovalResponse)
//   AISDK_CANCEL   a URL to POST once the reply has begun (the app's stop)
//   AISDK_WORKER   print {"worker": PID} first, from the answer's X-Worker
//   AISDK_RESUME_ON_ERROR  a chat that ends in error resumes its stream
//   AISDK_HEADERS  {"name": value}: headers of every request the
//                  transport sends (its headers option), a traceparent
//
// Prints the chat's status, errors and messages as one JSON line.

import { chatClass } from './chat.mjs';

const ai = await import(process.env.AISDK_PKG || 'ai');
const { DefaultChatTransport } = ai;

const Chat = chatClass(ai);

const [url, id, command, text] = process.argv.slice(2);

// a test that has what it needs closes the pipe
process.stdout.on('error', () => process.exit(0));
const tools = JSON.parse(process.env.AISDK_TOOLS || '{}');
const approve = process.env.AISDK_APPROVE;
const chunks = [];
const errors = [];
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// as in the README: the chat goes on by itself once the client has
// answered every call of the reply that waits for it

const answered = ({ messages }) =>
    (ai.lastAssistantMessageIsCompleteWithApprovalResponses
     && ai.lastAssistantMessageIsCompleteWithApprovalResponses({ messages }))
    || ai.lastAssistantMessageIsCompleteWithToolCalls({ messages });

// the transport's own fetch option, to see which worker answers

// and the chunks' types as they came, read from a copy of the answer

const types = [];

const seen = (u, init) => fetch(u, init).then((r) => {
    if (process.env.AISDK_WORKER) {
        console.log(JSON.stringify({ worker: +r.headers.get('x-worker'),
                                     status: r.status }));
    }
    if (r.ok && r.body) {
        r.clone().text().then((body) => {
            for (const m of body.matchAll(/^data: (\{.*)$/gm)) {
                types.push(JSON.parse(m[1]).type);
            }
        }, () => {});
    }
    return r;
});

const chat = new Chat({
    id,
    transport: new DefaultChatTransport({
        api: url, fetch: seen,
        headers: JSON.parse(process.env.AISDK_HEADERS || '{}'),
    }),
    sendAutomaticallyWhen: answered,
    onToolCall: ({ toolCall }) => {
        if (toolCall.toolName in tools) {
            chat.addToolOutput({
                tool: toolCall.toolName,
                toolCallId: toolCall.toolCallId,
                output: tools[toolCall.toolName],
            });
        }
    },
    onData: (part) => chunks.push(part),
    onError: (e) => errors.push(e.message),
});

const requested = new Set();

function approvals() {
    const last = chat.messages[chat.messages.length - 1];
    const parts = (last && last.role === 'assistant') ? last.parts : [];

    for (const p of parts) {
        if (p.state === 'approval-requested' && approve
            && !requested.has(p.approval.id))
        {
            const [yes, reason] = approve.split(':');
            requested.add(p.approval.id);
            chat.addToolApprovalResponse({
                id: p.approval.id, approved: yes === 'yes', reason,
            });
        }
    }
}

// until the chat has been ready (or in error) for a while: requests the
// chat sends by itself start after the one before has ended

async function settle() {
    let quiet = 0;

    for (let i = 0; i < 400 && quiet < 8; i++) {
        await sleep(25);
        approvals();
        quiet = (chat.status === 'ready' || chat.status === 'error')
                ? quiet + 1 : 0;
    }
}

async function cancelled() {
    for (let i = 0; i < 400; i++) {
        const last = chat.messages[chat.messages.length - 1];
        if (last && last.role === 'assistant'
            && last.parts.some((p) => p.type === 'text' && p.text))
        {
            break;
        }
        await sleep(10);
    }

    // the app's stop: the turn is cancelled, the stream ends with it
    const r = await fetch(process.env.AISDK_CANCEL, { method: 'POST' });
    return r.status;
}

let cancel;

if (command === 'send') {
    const sent = chat.sendMessage({ text });
    if (process.env.AISDK_CANCEL) {
        cancel = await cancelled();
    }
    await sent;
} else {
    await chat.resumeStream();
}

await settle();

if (process.env.AISDK_RESUME_ON_ERROR && chat.status === 'error') {
    chat.clearError();
    await chat.resumeStream();
    await settle();
}

console.log(JSON.stringify({
    status: chat.status,
    error: chat.error ? chat.error.message : null,
    errors,
    cancel,
    types,
    messages: chat.messages,
    data: chunks,
}));
