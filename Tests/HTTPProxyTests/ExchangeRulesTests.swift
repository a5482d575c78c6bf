import GatewayConfig
import NIOCore
import NIOHTTP1
import Testing

@testable import HTTPProxy

@Suite("Exchange rules (no I/O)")
struct ExchangeRulesTests {
    @Test("response framing towards the client", arguments: [
        ("HEAD with a length", HTTPMethod.HEAD, 200, true, HTTPVersion.http1_1, ExchangeRules.ResponseFraming.noBody),
        ("HEAD without a length", .HEAD, 200, false, .http1_1, .noBody),
        ("204", .GET, 204, false, .http1_1, .noBody),
        ("304 with a length", .GET, 304, true, .http1_1, .noBody),
        ("length given", .GET, 200, true, .http1_1, .raw),
        ("length given to HTTP/1.0", .GET, 200, true, .http1_0, .raw),
        ("no length, HTTP/1.1 client", .POST, 200, false, .http1_1, .chunked),
        ("no length, HTTP/1.0 client", .GET, 500, false, .http1_0, .untilClose),
        ("no length, HTTP/2 stream (its DATA frames end with the stream)", .GET, 200, false, HTTPVersion(major: 2, minor: 0), .chunked),
        ("HEAD on an HTTP/2 stream", .HEAD, 200, true, HTTPVersion(major: 2, minor: 0), .noBody),
    ] as [(String, HTTPMethod, Int, Bool, HTTPVersion, ExchangeRules.ResponseFraming)])
    func framing(name: String, method: HTTPMethod, status: Int, hasLength: Bool, version: HTTPVersion, expected: ExchangeRules.ResponseFraming) {
        #expect(ExchangeRules.responseFraming(requestMethod: method, status: status, hasContentLength: hasLength, clientVersion: version) == expected, "\(name)")
    }

    @Test("an upstream connection serves one principal: the user, an anonymous client's own connection, anyone, or one request", arguments: [
        ("principal, signed in", GatewayConfiguration.UpstreamReuse.principal, "alice" as String?, false, false, UpstreamPrincipal?.some(.user("alice"))),
        ("principal, anonymous", .principal, nil, false, false, .client(7)),
        ("principal, signed in, with a body (CL.0)", .principal, "alice", true, false, nil),
        ("principal, anonymous, with a body (CL.0)", .principal, nil, true, false, nil),
        ("principal, anonymous through a trusted proxy", .principal, nil, false, true, nil),
        ("principal, signed in through a trusted proxy", .principal, "alice", false, true, .user("alice")),
        ("shared, signed in", .shared, "alice", false, false, .anyone),
        ("shared, anonymous with a body", .shared, nil, true, true, .anyone),
        ("none, signed in", .none, "alice", false, false, nil),
        ("none, anonymous", .none, nil, false, false, nil),
    ] as [(String, GatewayConfiguration.UpstreamReuse, String?, Bool, Bool, UpstreamPrincipal?)])
    func principal(name: String, reuse: GatewayConfiguration.UpstreamReuse, user: String?, hasBody: Bool, viaProxy: Bool, expected: UpstreamPrincipal?) {
        #expect(ExchangeRules.upstreamPrincipal(reuse: reuse, user: user, client: 7, hasBody: hasBody, viaTrustedProxy: viaProxy) == expected, "\(name)")
    }

    @Test("a response without a body by its method or status that announces one leaves its connection in doubt", arguments: [
        ("HEAD with a length", HTTPMethod.HEAD, "HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n", true),
        ("HEAD with length 0", .HEAD, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", false),
        ("HEAD, chunked", .HEAD, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", true),
        ("HEAD without framing", .HEAD, "HTTP/1.1 200 OK\r\n\r\n", false),
        ("204 with a length", .GET, "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n", true),
        ("204 bare", .GET, "HTTP/1.1 204 No Content\r\n\r\n", false),
        ("304 chunked", .GET, "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n", true),
        ("304 with a length", .GET, "HTTP/1.1 304 Not Modified\r\nContent-Length: 40\r\n\r\n", true),
        ("100 with a length", .POST, "HTTP/1.1 100 Continue\r\nContent-Length: 3\r\n\r\n", true),
        ("200 with a length", .GET, "HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n", false),
        ("200 chunked", .GET, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", false),
    ] as [(String, HTTPMethod, String, Bool)])
    func unsentBody(name: String, method: HTTPMethod, raw: String, expected: Bool) throws {
        var parser = HeadParser(kind: .response, maxHeadBytes: 8192, maxFields: 100)
        var buffer = ByteBuffer(string: raw)
        let head = try #require(try parser.parse(&buffer))
        #expect(MessageFraming.declaresUnsentBody(head, requestMethod: method) == expected, "\(name)")
    }

    @Test("upstream keep-alive", arguments: [
        (HTTPVersion.http1_1, [String](), true), (.http1_1, ["close"], false), (.http1_1, ["keep-alive"], true),
        (.http1_0, [], false), (.http1_0, ["keep-alive"], true),
    ])
    func upstreamKeepAlive(version: HTTPVersion, tokens: [String], expected: Bool) {
        #expect(ExchangeRules.upstreamKeepsAlive(version: version, connectionTokens: tokens) == expected)
    }

    @Test("retry only idempotent, body-less, complete requests on a reused connection, once", arguments: [
        ("GET on a reused connection", HTTPMethod.GET, true, false, true, false, true),
        ("PUT without a body", .PUT, true, false, true, false, true),
        ("POST", .POST, true, false, true, false, false),
        ("PATCH", .PATCH, true, false, true, false, false),
        ("GET on a fresh connection", .GET, false, false, true, false, false),
        ("GET with a body", .GET, true, true, true, false, false),
        ("GET not yet complete", .GET, true, false, false, false, false),
        ("GET retried already", .GET, true, false, true, true, false),
    ] as [(String, HTTPMethod, Bool, Bool, Bool, Bool, Bool)])
    func retry(name: String, method: HTTPMethod, reused: Bool, body: Bool, ended: Bool, retried: Bool, expected: Bool) {
        #expect(ExchangeRules.mayRetry(method: method, connectionWasReused: reused, requestHasBody: body, requestEnded: ended, alreadyRetried: retried) == expected, "\(name)")
    }

    @Test("reading the client", arguments: [
        ("idle", ExchangeRules.Phase.idle, false, false, true, false, true),
        ("idle while draining", .idle, true, false, true, false, false),
        ("awaiting a verdict", .awaitingVerdict, false, false, true, true, false),
        ("connecting upstream", .connecting, false, false, true, true, false),
        ("collecting a body for a local endpoint", .collecting, false, false, true, false, true),
        ("local endpoint body complete", .collecting, false, true, true, false, false),
        ("body, upstream writable", .forwarding, false, false, true, true, true),
        ("body, upstream full", .forwarding, false, false, true, false, false),
        ("request done, nothing queued", .forwarding, false, true, true, false, true),
        ("request done, a pipelined request held unparsed", .forwarding, false, true, false, true, false),
        ("closed", .closed, false, false, true, true, false),
    ] as [(String, ExchangeRules.Phase, Bool, Bool, Bool, Bool, Bool)])
    func reading(name: String, phase: ExchangeRules.Phase, quiescing: Bool, ended: Bool, pipelinedEmpty: Bool, writable: Bool, expected: Bool) {
        #expect(ExchangeRules.shouldReadClient(phase: phase, quiescing: quiescing, requestEnded: ended, pipelinedEmpty: pipelinedEmpty, upstreamWritable: writable) == expected, "\(name)")
    }

    @Test("between requests, the client is read only while it takes our responses", arguments: [
        (ExchangeRules.Phase.idle, true, true), (.idle, false, false), (.forwarding, false, true),
    ])
    func readingPacedByClient(phase: ExchangeRules.Phase, clientWritable: Bool, expected: Bool) {
        #expect(ExchangeRules.shouldReadClient(phase: phase, quiescing: false, requestEnded: false, pipelinedEmpty: true, upstreamWritable: true,
                                               clientWritable: clientWritable) == expected)
    }

    @Test("a decoder error: answered now, or the connection aborted", arguments: [
        ("nothing in flight", ExchangeRules.Phase.idle, false, ExchangeRules.DecoderErrorAction.answerNow),
        ("junk inside the request's own body", .forwarding, false, .answerNow),
        ("junk inside the body while the verdict is pending", .awaitingVerdict, false, .answerNow),
        ("junk inside the body while the response streams", .forwarding, true, .abort),
    ] as [(String, ExchangeRules.Phase, Bool, ExchangeRules.DecoderErrorAction)])
    func decoderError(_ name: String, phase: ExchangeRules.Phase, started: Bool, expected: ExchangeRules.DecoderErrorAction) {
        #expect(ExchangeRules.onDecoderError(phase: phase, responseStarted: started) == expected, "\(name)")
    }

    @Test("the client's input ends (its FIN, everything complete before it handed in)", arguments: [
        ("between requests", ExchangeRules.Phase.idle, false, ExchangeRules.InputEndAction.close),
        ("a request cut short while the verdict is pending", .awaitingVerdict, false, .abortRequest),
        ("a body cut short for a local endpoint", .collecting, false, .abortRequest),
        ("a body cut short while connecting upstream", .connecting, false, .abortRequest),
        ("a body cut short while forwarding it", .forwarding, false, .abortRequest),
        ("a complete request awaiting its verdict", .awaitingVerdict, true, .carryOn),
        ("a complete request being answered", .forwarding, true, .carryOn),
        ("closing already", .closed, false, .carryOn),
    ] as [(String, ExchangeRules.Phase, Bool, ExchangeRules.InputEndAction)])
    func clientInputEnd(_ name: String, phase: ExchangeRules.Phase, ended: Bool, expected: ExchangeRules.InputEndAction) {
        #expect(ExchangeRules.onClientInputEnd(phase: phase, requestEnded: ended) == expected, "\(name)")
    }

    @Test("the Connection field of a response head to the client", arguments: [
        ("HTTP/1.1, kept", true, HTTPVersion.http1_1, ExchangeRules.ConnectionField.none),
        ("HTTP/1.1, closed", false, .http1_1, .close),
        ("HTTP/1.0 that asked for keep-alive, kept", true, .http1_0, .keepAlive),
        ("HTTP/1.0, closed", false, .http1_0, .close),
    ] as [(String, Bool, HTTPVersion, ExchangeRules.ConnectionField)])
    func connectionField(_ name: String, keepAlive: Bool, version: HTTPVersion, expected: ExchangeRules.ConnectionField) {
        #expect(ExchangeRules.connectionField(keepAlive: keepAlive, clientVersion: version) == expected, "\(name)")
    }

    @Test("a response status is relayed only within 100–599", arguments: [
        (100, true), (101, true), (200, true), (599, true), (99, false), (600, false), (999, false),
    ])
    func relaysStatus(status: Int, expected: Bool) {
        #expect(ExchangeRules.relaysStatus(status) == expected)
    }

    @Test("the body deadline: the allowance, plus time the gateway held the client, plus a second per KiB received")
    func bodyDeadline() {
        let start = NIODeadline.uptimeNanoseconds(1_000_000_000)
        #expect(ExchangeRules.bodyDeadline(start: start, allowance: .seconds(60), held: .zero, bytesReceived: 0) == start + .seconds(60))
        #expect(ExchangeRules.bodyDeadline(start: start, allowance: .seconds(60), held: .seconds(5), bytesReceived: 1023) == start + .seconds(65))
        #expect(ExchangeRules.bodyDeadline(start: start, allowance: .seconds(60), held: .zero, bytesReceived: 10 * 1024 * 1024) == start + .seconds(60 + 10 * 1024))
    }

    @Test("client keep-alive after an exchange", arguments: [
        ("asked, complete", true, true, false, true), ("not asked", false, true, false, false), ("body not read to its end", true, false, false, false),
        ("draining", true, true, true, false),
    ])
    func clientKeepAlive(_ name: String, requested: Bool, complete: Bool, quiescing: Bool, expected: Bool) {
        #expect(ExchangeRules.clientKeepsAlive(requested: requested, requestComplete: complete, quiescing: quiescing) == expected, "\(name)")
    }
}
