// t/traces.t: an OTLP/HTTP collector and a tool backend instrumented with
// OpenTelemetry's own SDK, in one process.
//
//   node otel.mjs DIR COLLECTOR_PORT TOOL_PORT
//
// The collector stores every request it gets, one JSON line each
// ({path, headers, body}), in DIR/otlp.jsonl, and answers with the status
// in DIR/collector.status (200 if there is none).  The tool backend
// (POST /tool) takes the request's traceparent with the W3C propagator,
// makes a span of its own as its child, exports it to the collector with
// the official OTLP/HTTP exporter (JSON), and answers the call.

import fs from 'node:fs';
import http from 'node:http';

import { context, propagation, trace, SpanKind, ROOT_CONTEXT }
    from '@opentelemetry/api';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { TracerProvider, SimpleSpanProcessor } from '@opentelemetry/sdk-trace';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';

const [dir, collectorPort, toolPort] = process.argv.slice(2);

function body(req) {
    return new Promise((resolve) => {
        const chunks = [];
        req.on('data', (c) => chunks.push(c));
        req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    });
}

http.createServer(async (req, res) => {
    const text = await body(req);
    let json = null;

    try {
        json = JSON.parse(text);
    } catch (e) {
        json = null;
    }

    fs.appendFileSync(`${dir}/otlp.jsonl`, JSON.stringify({
        path: req.url, headers: req.headers, body: json, raw: json ? '' : text
    }) + '\n');

    let status = 200;

    try {
        status = parseInt(fs.readFileSync(`${dir}/collector.status`, 'utf8'));
    } catch (e) {
        status = 200;
    }

    res.writeHead(status, { 'Content-Type': 'application/json' });
    res.end('{}');
}).listen(collectorPort, '127.0.0.1');

propagation.setGlobalPropagator(new W3CTraceContextPropagator());

const provider = new TracerProvider({
    resource: resourceFromAttributes({ 'service.name': 'tool-backend' }),
    spanProcessors: [new SimpleSpanProcessor({ exporter: new OTLPTraceExporter({
        url: `http://127.0.0.1:${collectorPort}/v1/traces`
    }) })]
});

trace.setGlobalTracerProvider(provider);

const tracer = trace.getTracer('t-traces-tool');

http.createServer(async (req, res) => {
    const text = await body(req);
    const parent = propagation.extract(ROOT_CONTEXT, req.headers);
    const span = tracer.startSpan('lookup backend', {
        kind: SpanKind.SERVER,
        attributes: { 'tool.call.id': req.headers['x-agent-tool-call'] || '' }
    }, parent);

    context.with(trace.setSpan(parent, span), () => {
        span.setAttribute('tool.arguments', text);
    });

    span.end();

    try {
        await provider.forceFlush();
    } catch (e) {
        /* a collector told to answer 500: the span is lost, as it would be */
    }

    res.writeHead(200, { 'Content-Type': 'application/json' });
    res.end(JSON.stringify({ result: { found: true,
        traceparent: req.headers.traceparent || '' } }));
}).listen(toolPort, '127.0.0.1');

fs.writeFileSync(`${dir}/otel.ready`, 'ok');
