import Foundation
import Logging
import NIOPosix
import GatewayConfig
import NIOHTTP1
import Testing
import TestSupport
@testable import Gateway

/// Traces across the proxy (issue 28 §3), against a real OTLP collector: the spans of a request
/// with their links and attributes, W3C context from trusted proxies only, export over HTTP and
/// gRPC, and an unavailable collector that costs requests nothing.
@Suite("Tracing", .serialized, .timeLimit(.minutes(5)))
struct TracingTests {
    static let callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
    static let callerSpan = "00f067aa0ba902b7"

    static func tracing(_ endpoint: String, protocol p: GatewayConfiguration.Tracing.ExportProtocol = .httpProtobuf,
                        includeUser: Bool = false, ratio: Double = 1) -> GatewayConfiguration.Tracing {
        var t = GatewayConfiguration.Tracing()
        t.endpoint = endpoint
        t.exportProtocol = p
        t.sampleRatio = ratio
        t.includeUser = includeUser
        t.headers = ["authorization": "Bearer collector-key"]
        return t
    }

    @Test("an authenticated request from a trusted proxy: its spans reach the collector, linked to the caller's span, and the app gets the trace")
    func authenticatedRequestSpans() async throws {
        try await OTLPReceiver.with { collector in
            // local_cache_ttl 0: the request reads its session from the store.
            try await SignInHarness.with(localCacheTTL: .zero, configure: {
                $0.tracing = Self.tracing(collector.httpEndpoint)
                $0.server.trustedProxies = [CIDR.parse("127.0.0.1/32")!]
            }) { h in
                let browser = TestBrowser(gatewayOrigin: h.origin)
                _ = try await browser.signIn(from: "/", as: h.simulator.createUser())
                let caller = "00-\(Self.callerTrace)-\(Self.callerSpan)-01"
                let r = try await browser.request("/api/traced", headers: [("traceparent", caller), ("tracestate", "vendor=abc")])
                #expect(r.status == 200)
                // The app's parent is the gateway's upstream span, in the caller's trace.
                let sent = try #require(r.body.split(separator: "\n").first { $0.lowercased().hasPrefix("traceparent: ") })
                let parts = sent.dropFirst("traceparent: ".count).split(separator: "-")
                #expect(parts.count == 4 && parts[0] == "00" && parts[1] == Self.callerTrace && parts[3] == "01", "\(sent)")
                #expect(r.body.contains("tracestate: vendor=abc"))

                let spans = try await collector.spans(of: Self.callerTrace, count: 5)
                func named(_ name: String) throws -> OTLPReceiver.Span { try #require(spans.first { $0.name == name }, "\(spans.map(\.name))") }
                let server = try named("GET api")
                let admission = try named("admission")
                let upstream = try named("upstream GET")
                let connect = try named("connect")
                let load = try named("store.load")
                #expect(server.kind == "SPAN_KIND_SERVER" && server.parent_span_id == Self.callerSpan)
                #expect(admission.parent_span_id == server.span_id && upstream.parent_span_id == server.span_id)
                #expect(connect.parent_span_id == upstream.span_id && load.parent_span_id == admission.span_id)
                #expect(upstream.kind == "SPAN_KIND_CLIENT" && String(parts[2]) == upstream.span_id, "the app's parent is the upstream span")
                #expect(server.attributes["http.request.method"] == .string("GET") && server.attributes["url.path"] == .string("/api/traced"))
                #expect(server.attributes["http.response.status_code"] == .int(200) && upstream.events == ["first_byte"])
                #expect(server.attributes["enduser.id"] == nil, "the user only with tracing.include_user")
                #expect(server.trace_state == "vendor=abc")
                #expect(server.start <= admission.start && admission.end <= upstream.start && upstream.end <= server.end)
                #expect(server.resource["service.name"] == .string("sessiongate") && server.via == "http")
                #expect(server.headers["authorization"] == "Bearer collector-key", "tracing.headers go with every export")

                // The sign-in: the callback's trace has the web flow, Apple's token call and the store's writes under it.
                let all = try await collector.spans()
                let signIn = try #require(all.first { $0.name == "sign_in.web" })
                let apple = try #require(all.first { $0.name == "apple.token" })
                #expect(apple.parent_span_id == signIn.span_id && apple.trace_id == signIn.trace_id && apple.kind == "SPAN_KIND_CLIENT")
                #expect(all.contains { $0.name == "store.create" && $0.parent_span_id == signIn.span_id })
                // Apple received the token call's own span as the parent.
                #expect(h.simulator.lastTraceparent("/auth/token") == "00-\(apple.trace_id)-\(apple.span_id)-01")
            }
        }
    }

    @Test("a traceparent from a client that is not a trusted proxy starts a new trace; the app receives the gateway's, not the client's")
    func untrustedContextIgnored() async throws {
        try await OTLPReceiver.with { collector in
            try await SignInHarness.with(configure: { $0.tracing = Self.tracing(collector.httpEndpoint) }) { h in
                let browser = TestBrowser(gatewayOrigin: h.origin)
                let forged = "00-\(Self.callerTrace)-\(Self.callerSpan)-01"
                let r = try await browser.request("/public/x", headers: [("traceparent", forged), ("tracestate", "forged=1")])
                #expect(r.status == 200)
                let sent = try #require(r.body.split(separator: "\n").first { $0.lowercased().hasPrefix("traceparent: ") })
                let traceID = String(sent.split(separator: "-")[1])
                #expect(traceID != Self.callerTrace && !r.body.contains("forged=1"))
                #expect(r.body.components(separatedBy: "traceparent:").count == 2, "one traceparent upstream")
                let spans = try await collector.spans(of: traceID, count: 4)
                let server = try #require(spans.first { $0.kind == "SPAN_KIND_SERVER" })
                #expect(server.parent_span_id == "" && server.name == "GET public")
            }
        }
    }

    @Test("over HTTP/2 (h2c): a trusted caller's trace continues on the stream, with the protocol in the request span")
    func http2Stream() async throws {
        try await OTLPReceiver.with { collector in
            try await SignInHarness.with(configure: {
                $0.tracing = Self.tracing(collector.httpEndpoint)
                $0.server.http2Cleartext = true
                $0.server.trustedProxies = [CIDR.parse("127.0.0.1/32")!]
            }) { h in
                let answer = try await HTTP2SignInTests.curl(h.origin + "/public/h2", headers: ["traceparent: 00-\(Self.callerTrace)-\(Self.callerSpan)-01"])
                #expect(answer.hasSuffix("\n2 200"), "\(answer)")
                #expect(answer.contains("traceparent: 00-\(Self.callerTrace)-"), "\(answer)")
                let spans = try await collector.spans(of: Self.callerTrace, count: 4)
                let server = try #require(spans.first { $0.kind == "SPAN_KIND_SERVER" })
                #expect(server.parent_span_id == Self.callerSpan && server.attributes["network.protocol.version"] == .string("2"))
            }
        }
    }

    @Test("over OTLP/gRPC, with the user's sub when tracing.include_user is on; an error status is counted, and the connection kept")
    func grpcExport() async throws {
        try await OTLPReceiver.with { collector in
            try await SignInHarness.with(configure: { $0.tracing = Self.tracing(collector.grpcEndpoint, protocol: .grpc, includeUser: true) }) { h in
                let browser = TestBrowser(gatewayOrigin: h.origin)
                let user = h.simulator.createUser()
                _ = try await browser.signIn(from: "/", as: user)
                let r = try await browser.request("/api/grpc")
                #expect(r.status == 200)
                let sent = try #require(r.body.split(separator: "\n").first { $0.lowercased().hasPrefix("traceparent: ") })
                let traceID = String(sent.split(separator: "-")[1])
                let spans = try await collector.spans(of: traceID, count: 4)
                let server = try #require(spans.first { $0.kind == "SPAN_KIND_SERVER" })
                #expect(server.via == "grpc" && server.headers["authorization"] == "Bearer collector-key")
                #expect(server.attributes["enduser.id"] == .string(user))

                // The collector answers UNAVAILABLE: a failed export, on a connection that answered.
                try await collector.fail(status: 503)
                _ = try await browser.request("/api/grpc-refused")
                let admin = "http://127.0.0.1:\(h.service.adminAddress!.port!)/metrics"
                try await eventually("the refused export counted") {
                    try await browser.request(admin).body.contains("sessiongate_tracing_exports_failed_total 1\n")
                }
                try await collector.fail(status: 0)
                let again = try await browser.request("/api/grpc-again")
                let next = try #require(again.body.split(separator: "\n").first { $0.lowercased().hasPrefix("traceparent: ") })
                let later = try await collector.spans(of: String(next.split(separator: "-")[1]), count: 4)
                #expect(later.count == 4 && later.allSatisfy { $0.peer == server.peer }, "the same connection: \(server.peer ?? "-")")
            }
        }
    }

    @Test("an event delivery is a trace of its own, and the app receives its context")
    func eventDelivery() async throws {
        try await OTLPReceiver.with { collector in
            try await EventReceiver.with { receiver in
                try await SignInHarness.with(assertion: true, configure: {
                    $0.events.url = receiver.url
                    $0.tracing = Self.tracing(collector.httpEndpoint)
                }) { h in
                    let browser = TestBrowser(gatewayOrigin: h.origin)
                    _ = try await browser.signIn(from: "/", as: h.simulator.createUser())
                    #expect(try await browser.request("/_auth/logout", method: .POST, headers: [("accept", "application/json")], form: []).status == 204)
                    let event = try #require(await receiver.waitFor(1).first)
                    let parts = try #require(event.traceparent?.split(separator: "-"), "the delivery carries a traceparent")
                    let spans = try await collector.spans(of: String(parts[1]), count: 1)
                    let delivery = try #require(spans.first)
                    #expect(delivery.name == "event.deliver" && delivery.kind == "SPAN_KIND_CLIENT" && delivery.span_id == String(parts[2]))
                    #expect(delivery.parent_span_id == "" && delivery.attributes["sessiongate.event.type"] == .string("session.ended"))

                    // A disconnect: the revocation at Apple runs from the outbox, as a trace of its own.
                    _ = try await browser.signIn(from: "/", as: h.simulator.createUser())
                    #expect(try await browser.request("/_auth/revoke", method: .POST, headers: [("accept", "application/json")], form: []).status == 204)
                    let job = try await Self.first(named: "outbox.apple_revoke", in: collector)
                    let revoke = try await Self.first(named: "apple.revoke", in: collector)
                    #expect(job.parent_span_id == "" && revoke.parent_span_id == job.span_id && revoke.trace_id == job.trace_id)
                    #expect(h.simulator.lastTraceparent("/auth/revoke") == "00-\(revoke.trace_id)-\(revoke.span_id)-01")
                }
            }
        }
    }

    @Test("the binary: the access log names each request's trace; sample_ratio reloads; spans still queued at SIGTERM are exported before it exits")
    func processAccessLogAndShutdown() async throws {
        try await OTLPReceiver.with { collector in
            try await TestUpstream.with { upstream in
                let yaml = gatewayYAML(upstreamPort: upstream.port, extraServer: "  access_log: json")
                    + "\ntracing:\n  endpoint: \"\(collector.httpEndpoint)\"\n"
                let gateway = try GatewayProcess.serve(yaml: yaml)
                let ports = try await gateway.ports()
                let response = try await blocking {
                    let c = try RawClient(port: ports.proxy)
                    try c.send("GET /echo/traced HTTP/1.1\r\nHost: a\r\n\r\n")
                    return try c.readResponse()
                }
                let sent = try #require(response.text.split(separator: "\n").first { $0.lowercased().hasPrefix("traceparent: ") })
                let traceID = String(sent.split(separator: "-")[1])
                let line = try #require(await gateway.waitForLine(containing: "\"path\":\"/echo/traced\""))
                let json = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
                #expect(json["trace_id"] as? String == traceID, "\(line)")

                // sample_ratio reloads (the only tracing key that does): new traces go unrecorded.
                #expect(try await gateway.reload(yaml: yaml + "  sample_ratio: 0\n")?.contains("configuration reloaded") == true)
                let unsampled = try await blocking {
                    let c = try RawClient(port: ports.proxy)
                    try c.send("GET /echo/unsampled HTTP/1.1\r\nHost: a\r\n\r\n")
                    return try c.readResponse()
                }
                let header = try #require(unsampled.text.split(separator: "\n").first { $0.lowercased().hasPrefix("traceparent: ") })
                #expect(header.hasSuffix("-00"), "\(header)")
                // Stopped at once: the spans wait for the next export (each second) or the drain's flush.
                await gateway.stopAndWait()
                #expect(try await collector.spans().filter { $0.trace_id == traceID }.count == 4, "exported before the process ended")
            }
        }
    }

    @Test("a full queue drops spans and counts them: recording never waits for the exporter")
    func queueFull() async throws {
        var c = GatewayConfiguration.Tracing()
        c.maxQueue = 64
        c.timeout = .milliseconds(500)
        let metrics = GatewayMetrics()
        let tracer = GatewayTracer(c, exporter: OTLPHTTPExporter(c, group: MultiThreadedEventLoopGroup.singleton), metrics: metrics,
                                   logger: Logger(label: "tracing-test"))
        // Not started: nothing takes spans off the queue.
        let root = tracer.root("work")
        for _ in 0..<100 { try #require(root.span).end() }
        let text = String(decoding: metrics.exposition(), as: UTF8.self)
        #expect(text.contains(#"sessiongate_tracing_spans_dropped_total{reason="queue_full"} 36"#), "\(text)")
        // Stopped (here by cancellation; in the gateway by the group's shutdown): one last export.
        let running = Task { await tracer.run() }
        running.cancel()
        await running.value
        #expect(String(decoding: metrics.exposition(), as: UTF8.self).contains(#"sessiongate_tracing_spans_dropped_total{reason="export_failed"} 64"#),
                "the queue is still exported at shutdown (here to a collector that is not there)")
    }

    @Test("a nested message's length: one byte up to 127, a longer varint after (the message moved along)", arguments: [0, 1, 125, 126, 127, 300, 20_000])
    func nestedLength(_ size: Int) {
        var w = ProtobufWriter()
        w.message(3) { $0.string(1, String(repeating: "x", count: size)) }
        w.varint(4, 1)
        // Expected: tag 3/LEN, varint(inner length), then tag 1/LEN, varint(size), the bytes; then field 4.
        func varint(_ v: Int) -> [UInt8] {
            var v = UInt64(v), out: [UInt8] = []
            while v >= 0x80 { out.append(UInt8(v & 0x7f) | 0x80); v >>= 7 }
            return out + [UInt8(v)]
        }
        let inner = [0x0a] + varint(size) + [UInt8](repeating: UInt8(ascii: "x"), count: size)
        #expect(w.bytes == [0x1a] + varint(inner.count) + inner + [0x20, 0x01])
    }

    @Test("sample_ratio 0: nothing is recorded, yet the app still receives a context (not sampled)")
    func unsampled() async throws {
        try await OTLPReceiver.with { collector in
            try await SignInHarness.with(configure: { $0.tracing = Self.tracing(collector.httpEndpoint, ratio: 0) }) { h in
                let browser = TestBrowser(gatewayOrigin: h.origin)
                let r = try await browser.request("/public/x")
                let sent = try #require(r.body.split(separator: "\n").first { $0.lowercased().hasPrefix("traceparent: ") })
                #expect(sent.hasSuffix("-00"), "\(sent)")
                // A sampled caller's trace is recorded whatever the ratio; nothing else is.
                let metrics = try await browser.request("http://127.0.0.1:\(h.service.adminAddress!.port!)/metrics").body
                #expect(metrics.contains("sessiongate_tracing_spans_exported_total 0\n"), "primed, and nothing recorded: \(metrics)")
                #expect(try await collector.spans().isEmpty)
            }
        }
    }

    @Test("a collector that refuses exports: requests are unaffected, the failures counted and logged once, and export resumes")
    func collectorDown() async throws {
        try await OTLPReceiver.with { collector in
            try await collector.fail(status: 503)
            let logs = LogRecorder()
            try await SignInHarness.with(logs: logs, configure: { $0.tracing = Self.tracing(collector.httpEndpoint) }) { h in
                let browser = TestBrowser(gatewayOrigin: h.origin)
                let admin = "http://127.0.0.1:\(h.service.adminAddress!.port!)/metrics"
                for _ in 0..<3 { #expect(try await browser.request("/public/x").status == 200) }
                // Three requests, four spans each, all in exports the collector refused.
                try await eventually("every span counted as dropped") {
                    try await browser.request(admin).body.contains(#"sessiongate_tracing_spans_dropped_total{reason="export_failed"} 12"#)
                }
                let metrics = try await browser.request(admin).body
                #expect(metrics.contains("sessiongate_tracing_exports_failed_total "), "\(metrics)")
                #expect(metrics.contains("sessiongate_tracing_spans_exported_total 0\n"))
                #expect(logs.all.filter { $0.contains("trace export failed") }.count == 1, "logged once per outage")

                try await collector.fail(status: 0)
                let r = try await browser.request("/public/back")
                let sent = try #require(r.body.split(separator: "\n").first { $0.lowercased().hasPrefix("traceparent: ") })
                #expect(try await collector.spans(of: String(sent.split(separator: "-")[1]), count: 4).count == 4)
                try await Poll.within(.seconds(10), "recovery logged") { logs.all.contains { $0.contains("trace export works again") } }
            }
        }
    }

    /// The first span named `name` the collector received, once one has.
    static func first(named name: String, in collector: OTLPReceiver) async throws -> OTLPReceiver.Span {
        var found: OTLPReceiver.Span? = nil
        try await eventually("a span named \(name)") {
            found = try await collector.spans().first { $0.name == name }
            return found != nil
        }
        return try #require(found)
    }
}
