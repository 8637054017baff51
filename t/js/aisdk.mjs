// The AI SDK's own chat client (the "ai" package's AbstractChat, which
// useChat wraps, with its DefaultChatTransport), unmodified, against an
// agent_aisdk location.  Every chunk is checked against the package's
// uiMessageChunkSchema by the transport; a chunk that does not match
// ends the request with an error.
//
//   node aisdk.mjs URL CHAT_ID send TEXT    a message, its reply streamed
//   node aisdk.mjs URL CHAT_ID resume       useChat({ resume: true })
//
// Prints the chat's status, error and messages as one JSON line.

import { AbstractChat, DefaultChatTransport } from 'ai';

class State {
    constructor() {
        this.status = 'ready';
        this.error = undefined;
        this.messages = [];
    }

    pushMessage(m) { this.messages = this.messages.concat(m); }
    popMessage() { this.messages = this.messages.slice(0, -1); }

    replaceMessage(i, m) {
        this.messages = [...this.messages.slice(0, i), m,
                         ...this.messages.slice(i + 1)];
    }

    snapshot(thing) { return structuredClone(thing); }
}

class Chat extends AbstractChat {
    constructor(init) {
        super({ ...init, state: new State() });
    }
}

const [url, id, command, text] = process.argv.slice(2);
const chunks = [];

const chat = new Chat({
    id,
    transport: new DefaultChatTransport({ api: url }),
    onData: (part) => chunks.push(part),
    onError: () => {},
});

if (command === 'send') {
    await chat.sendMessage({ text });
} else {
    await chat.resumeStream();
}

console.log(JSON.stringify({
    status: chat.status,
    error: chat.error ? chat.error.message : null,
    messages: chat.messages,
    data: chunks,
}));
