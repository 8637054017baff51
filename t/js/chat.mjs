// The AI SDK's AbstractChat (what useChat wraps) with the state a
// framework would keep, for the scripts that drive it: aisdk.mjs,
// aisdk_branches.mjs.  chatClass(ai) is the Chat of that package;
// init.messages, if given, are the chat's messages to begin with.

class State {
    constructor(messages) {
        this.status = 'ready';
        this.error = undefined;
        this.messages = messages || [];
    }

    pushMessage(m) { this.messages = this.messages.concat(m); }
    popMessage() { this.messages = this.messages.slice(0, -1); }

    replaceMessage(i, m) {
        this.messages = [...this.messages.slice(0, i), m,
                         ...this.messages.slice(i + 1)];
    }

    snapshot(thing) { return structuredClone(thing); }
}

export function chatClass(ai) {
    return class Chat extends ai.AbstractChat {
        constructor(init) {
            super({ ...init, state: new State(init.messages) });
        }
    };
}
