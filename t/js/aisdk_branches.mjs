// The AI SDK's own chat client (the "ai" package's AbstractChat, which
// useChat wraps, with its DefaultChatTransport), unmodified, driven
// through a chat's history changes against an agent_aisdk location.
//
//   node aisdk_branches.mjs URL CHAT_ID STEPS
//
// STEPS is a JSON array run in order on one chat, each step one of:
//   {"send": TEXT}                       sendMessage({ text })
//   {"regenerate": true}                 regenerate()
//   {"regenerate": INDEX}                regenerate({ messageId }) of the
//                                        chat's message at INDEX
//   {"keep": N, "send": TEXT}            setMessages(messages.slice(0, N))
//                                        then sendMessage({ text })
//   {"edit": INDEX, "text": TEXT}        sendMessage({ text, messageId })
//                                        of the user message at INDEX
//
// Environment: AISDK_PKG, the package (ai, ai6, ai7; ai7 unless told);
// AISDK_MESSAGES, the chat's messages to begin with (a JSON array).
//
// Prints one JSON line: per step the chat's status, error and messages
// after it, and the bodies of the requests the transport sent.

import { chatClass } from './chat.mjs';

const ai = await import(process.env.AISDK_PKG || 'ai7');
const { DefaultChatTransport } = ai;

const Chat = chatClass(ai);

const [url, id, steps] = process.argv.slice(2);

process.stdout.on('error', () => process.exit(0));

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const bodies = [];

const seen = (u, init) => {
    bodies.push(JSON.parse(init.body));
    return fetch(u, init);
};

const chat = new Chat({
    id,
    messages: JSON.parse(process.env.AISDK_MESSAGES || '[]'),
    transport: new DefaultChatTransport({ api: url, fetch: seen }),
});

async function settle() {
    let quiet = 0;

    for (let i = 0; i < 400 && quiet < 4; i++) {
        await sleep(25);
        quiet = (chat.status === 'ready' || chat.status === 'error')
                ? quiet + 1 : 0;
    }
}

const out = [];

for (const step of JSON.parse(steps)) {
    let thrown = null;

    try {
        if (step.regenerate === true) {
            await chat.regenerate();
        } else if (step.regenerate !== undefined) {
            await chat.regenerate({
                messageId: chat.messages[step.regenerate].id,
            });
        } else if (step.edit !== undefined) {
            await chat.sendMessage({
                text: step.text, messageId: chat.messages[step.edit].id,
            });
        } else {
            if (step.keep !== undefined) {
                chat.messages = chat.messages.slice(0, step.keep);
            }
            await chat.sendMessage({ text: step.send });
        }
    } catch (e) {
        thrown = e.message;
    }

    await settle();

    out.push({
        status: chat.status,
        error: chat.error ? chat.error.message : thrown,
        messages: structuredClone(chat.messages),
    });

    if (chat.status === 'error') {
        chat.clearError();
    }
}

console.log(JSON.stringify({ steps: out, bodies }));
