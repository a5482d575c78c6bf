import GatewayConfig
import NIOCore
import NIOHTTP1

/// A request head arrives: the checks that answer it locally (CONNECT, the header rules, the
/// target, the route, TRACE, the WebSocket origin, a declared body too large), then the guard;
/// and the request's body parts, counted against the route's bound.
extension ClientConnectionStateMachine {
    mutating func startExchange(_ head: WireHead, now: NIODeadline) -> Action {
        bodyStart = nil
        buffered.removeAll(keepingCapacity: true)
        let x = newExchange(method: head.method, clientVersion: head.version, start: now, path: head.target)
        state = .awaitingVerdict(x)
        // The wire engine reads HTTP/1.0 and HTTP/1.1 only, heads within server.limits.
        if head.method == .CONNECT {
            // A tunnel to wherever the client names is not what a gateway in front of an app
            // offers (nginx answers 405 too); the reader parsed nothing behind it.
            return respond(Self.methodNotAllowed("CONNECT is not proxied"), x)
        }
        let snapshot = shared.snapshot
        let trusted = snapshot.trusts(peerAddress)
        peerTrusted = trusted
        let inbound: InboundRequest
        switch snapshot.rules.inspect(head, peerTrusted: trusted) {
        case .success(let value): inbound = value
        case .failure(.badRequest(let reason)): return respond(.error(.badRequest, reason, close: true), x)
        case .failure(.expectationFailed): return respond(.error(.expectationFailed, "only Expect: 100-continue is supported", close: true), x)
        }
        x.requestHasBody = inbound.framing != .none
        x.requestChunked = inbound.framing == .chunked
        x.keepAlive = inbound.keepAlive && !quiescing && !inbound.isWebSocketUpgrade
        x.isWebSocket = inbound.isWebSocketUpgrade
        if let id = inbound.requestID { x.requestID = id }
        if shared.observer.wantsRequestDetails { x.userAgent = head.firstValue(named: "user-agent") }
        if inbound.upgrade == nil, head.fields.contains(where: { head.nameIs($0, "upgrade") }) {
            // e.g. h2c: served as plain HTTP/1.1 without the upgrade, then closed (the
            // reader stops parsing after an upgrade request).
            x.keepAlive = false
        }
        let target: RequestTarget
        switch RequestTarget.parse(head.target, host: inbound.host) {
        case .success(let t): target = t
        case .failure(let rejection): return respond(.error(.badRequest, rejection.rawValue, close: true), x)
        }
        x.path = target.path
        guard let route = snapshot.table.match(host: inbound.host, path: target.path) else {
            return respond(.error(.notFound, "no route for this host and path"), x)
        }
        if head.method == .TRACE, !route.allowTrace {
            var response = Self.methodNotAllowed("TRACE is not forwarded on this route")
            response.close = false
            return respond(response, x)
        }
        if inbound.isWebSocketUpgrade, !snapshot.origins.admits(origin: head.firstValue(named: "origin"), host: inbound.host) {
            return respond(.error(.forbidden, "cross-origin WebSocket handshake refused", close: true), x)
        }
        x.maxBodyBytes = route.maxBodyBytes
        if route.maxBodyBytes > 0, case .contentLength(let length) = inbound.framing, length > route.maxBodyBytes {
            return respond(.error(.payloadTooLarge, "request body larger than \(route.maxBodyBytes) bytes", close: true), x)
        }
        if x.requestHasBody {
            bodyStart = now
            bodyHeld = .zero
            heldSince = nil
        }
        x.route = route
        x.inbound = inbound
        x.target = target
        x.snapshot = snapshot
        return .admit(x, route)
    }

    /// A context for a new request: the last one if only this machine still holds it (then no
    /// answer for it can come back, so reusing its identity is safe), otherwise a new one.
    mutating func newExchange(method: HTTPMethod, clientVersion: HTTPVersion, start: NIODeadline, path: String) -> ExchangeContext {
        let requestID = nextRequestID()
        if isKnownUniquelyReferenced(&spare), let x = spare {
            x.reset(method: method, clientVersion: clientVersion, start: start, path: path, requestID: requestID)
            return x
        }
        let x = ExchangeContext(method: method, clientVersion: clientVersion, start: start, path: path, requestID: requestID)
        spare = x
        return x
    }

    /// Counts a body part against the route's bound; the failure to run when it is exceeded.
    mutating func count(_ part: Part, _ x: ExchangeContext) -> Action? {
        switch part {
        case .end:
            x.requestEnded = true
            bodyStart = nil
        case .body(let bytes):
            x.bodyBytes += bytes.readableBytes
            if x.maxBodyBytes > 0, x.bodyBytes > x.maxBodyBytes {
                return requestFailed(.payloadTooLarge, "request body larger than \(x.maxBodyBytes) bytes")
            }
        case .head:
            break
        }
        return nil
    }

    /// A body part for one of the gateway's own endpoints (the state is `.collecting(x, _)`).
    mutating func collect(_ part: Part, _ x: ExchangeContext, _ collector: inout Collector) -> Action {
        // The state lets go of its copy first, so that the body grows in place.
        state = .answering(x)
        switch part {
        case .head:
            break
        case .body(var bytes):
            guard collector.body.readableBytes + bytes.readableBytes <= collector.maxBytes else {
                return respond(.error(.payloadTooLarge, "request body larger than \(collector.maxBytes) bytes", close: true), x)
            }
            collector.body.writeBuffer(&bytes)
        case .end:
            return .answer(x, collector.body, respond: collector.respond)
        }
        state = .collecting(x, collector)
        return .none
    }

    /// 405 with `Allow` (RFC 9110 §15.5.6), closing the connection.
    static func methodNotAllowed(_ reason: String) -> LocalResponse {
        var response = LocalResponse.error(.methodNotAllowed, reason, close: true)
        response.headers.append(("allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"))
        return response
    }
}
