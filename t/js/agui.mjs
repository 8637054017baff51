// The AG-UI client (@ag-ui/client's HttpAgent, unmodified) against an
// agent_agui location.  HttpAgent checks every event against the
// protocol's schema and its event verifier; an event out of place ends
// the run with an error.
//
//   node agui.mjs SPEC
//
// SPEC is JSON: {"url", "threadId", "tools": [...], "state": {...},
// "messages": [...], "headers": {...}, "steps": [STEP...]} (headers: of
// every run's request, HttpAgent's headers option), each step one run:
//   {"send": TEXT}          a user message, then a run
//   {"tool": CONTENT}       a tool message answering each frontend tool
//                           call the run before left pending, then a run
//   {"resume": PAYLOAD, "status": "resolved"|"cancelled"}
//                           answers to the interrupts of the run before
//   {}                      a run with nothing new (a connect)
//   {"keep": N, "send": TEXT}
//                           setMessages(messages.slice(0, N)), then a
//                           user message and a run
//   {"edit": INDEX, "text": TEXT}
//                           the user message at INDEX given a new text,
//                           the messages after it dropped, then a run
// and any step may have "headers": that run's and the next ones'.
//
// Prints, as one JSON line, each run's events (types, CUSTOM by name),
// error, outcome, interrupts and pending tool calls, the messages before
// the run's MESSAGES_SNAPSHOT, and the agent's final messages and state.

import { randomUUID } from 'node:crypto';
import { HttpAgent } from '@ag-ui/client';

const spec = JSON.parse(process.argv[2]);

const agent = new HttpAgent({
    url: spec.url,
    threadId: spec.threadId,
    initialMessages: spec.messages || [],
    initialState: spec.state || {},
    headers: spec.headers || {},
});

const runs = [];
let pending = [];
let interrupts = [];

for (const step of spec.steps) {
    const run = { events: [], error: null };
    const params = { tools: spec.tools || [] };

    if (step.keep !== undefined) {
        agent.setMessages(agent.messages.slice(0, step.keep));
    }

    if (step.edit !== undefined) {
        const m = agent.messages[step.edit];
        agent.setMessages([...agent.messages.slice(0, step.edit),
                           { ...m, content: step.text }]);
    }

    if (step.headers !== undefined) {
        agent.headers = step.headers;
    }

    if (step.send !== undefined) {
        agent.addMessage({ id: step.id || randomUUID(), role: 'user',
                           content: step.send });
    }

    if (step.tool !== undefined) {
        for (const id of pending) {
            agent.addMessage({ id: randomUUID(), role: 'tool',
                               toolCallId: id,
                               content: typeof step.tool === 'string'
                                   ? step.tool : JSON.stringify(step.tool) });
        }
    }

    if (step.resume !== undefined) {
        params.resume = interrupts.map((i) => ({
            interruptId: i.id,
            status: step.status || 'resolved',
            payload: step.resume,
        }));
    }

    const subscriber = {
        onEvent({ event }) {
            run.events.push(event.type === 'CUSTOM'
                ? `CUSTOM:${event.name}` : event.type);
        },
        onRunFinishedEvent(e) {
            run.outcome = e.outcome;
            pending = e.pendingToolCallIds || [];
            interrupts = e.interrupts || [];
            run.pending = pending;
            run.interrupts = interrupts;
        },
        onRunErrorEvent({ event }) {
            run.runError = event.message;
        },
        onMessagesSnapshotEvent({ messages }) {
            run.before = structuredClone(messages);
        },
        onStateSnapshotEvent({ event }) {
            run.state = event.snapshot;
        },
    };

    try {
        await agent.runAgent(params, subscriber);
    } catch (e) {
        run.error = String(e && e.message ? e.message : e);
    }

    runs.push(run);
}

console.log(JSON.stringify({
    runs,
    messages: agent.messages,
    state: agent.state,
}));
