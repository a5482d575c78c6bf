import GatewayConfig
import NIOCore
import NIOHTTP1

/// What the upstream connection delivers: the response head (relayed, refused, an interim, the
/// 101 of a WebSocket handshake), its body and end, or its failure (retried once, 502, abort).
extension ClientConnectionStateMachine {
    mutating func upstreamPart(_ part: ResponseReader.Part, now: @autoclosure () -> NIODeadline) -> Action {
        guard case .forwarding(let x, let upstream) = state else { return .none }
        switch part {
        case .head(let head):
            return responseHead(head, x, upstream, now: now())
        case .body(let bytes):
            x.bytesSent += bytes.readableBytes
            if x.framing == .noBody { return .none }
            return .writeBody(bytes, chunked: x.framing == .chunked)
        case .end:
            // Response trailers are not relayed.
            responseDeadline = nil
            buffered.removeAll()
            let after = afterResponse(x)
            state = after == .close ? .closed : .idle()
            return .finish(x, lastChunk: x.framing == .chunked, upstream: upstream,
                           reuse: x.requestEnded && x.upstreamKeepAlive && !x.isWebSocket, after: after)
        }
    }

    mutating func responseHead(_ wire: WireHead, _ x: ExchangeContext, _ upstream: UpstreamConnection, now: NIODeadline) -> Action {
        let status = wire.status
        if let start = x.upstreamStart, x.upstreamNanoseconds == nil, status >= 200 || status == 101 {
            x.upstreamNanoseconds = Int64(now.uptimeNanoseconds - start.uptimeNanoseconds)
        }
        if status == 101 {
            if x.isWebSocket, !x.responseStarted {
                x.status = 101
                x.responseStarted = true
                state = .closed
                return .upgrade(x, upstream, ResponseHead(wire))
            }
            return respond(.error(.badGateway, "upstream switched protocols unasked"), x, failure: .closedBeforeResponse)
        }
        guard ExchangeRules.relaysStatus(status) else {
            return respond(.error(.badGateway, "upstream answered with an invalid status"), x, failure: .invalidResponse)
        }
        if status < 200 {
            // Interim (100 Continue, 103): the status line alone, to HTTP/1.1 clients.
            guard x.clientVersion.minor >= 1 else { return .none }
            var buffer = allocator.buffer(capacity: 64)
            HTTPWire.writeStatusLine(HTTPResponseStatus(statusCode: status), into: &buffer)
            buffer.writeStaticString("\r\n")
            return .write(buffer)
        }
        let head = ResponseHead(wire)
        responseDeadline = nil
        x.responseStarted = true
        x.status = status
        x.upstreamKeepAlive = ExchangeRules.upstreamKeepsAlive(version: wire.version, connectionTokens: head.connectionTokens)
        x.framing = ExchangeRules.responseFraming(requestMethod: x.method, status: status, hasContentLength: head.hasContentLength,
                                                  clientVersion: x.clientVersion)
        if x.framing == .untilClose || quiescing { x.keepAlive = false }
        var buffer = allocator.buffer(capacity: wire.bytes.readableBytes + 96)
        head.write(rules: x.snapshot?.rules,
                   .init(requestID: x.requestID, chunked: x.framing == .chunked, keepAlive: x.keepAlive, clientVersion: x.clientVersion),
                   into: &buffer)
        return .write(buffer)
    }

    /// The upstream connection closed (`error`: it sent what is not a response, or failed).
    mutating func upstreamClosed(_ error: (any Error)?) -> Action {
        guard case .forwarding(let x, let connection) = state else { return .none }
        if let invalid = error as? WireError {
            // Bytes that are not a response (framing two hops could read differently, a bad
            // status line, a truncated chunk): never relayed.
            guard x.responseStarted else {
                return respond(.error(.badGateway, "upstream response refused: \(invalid)"), x, upstream: nil, failure: .invalidResponse)
            }
            state = .closed
            return .abort(x, upstream: nil, failure: .invalidResponse)
        }
        if !x.responseStarted {
            if ExchangeRules.mayRetry(method: x.method, connectionWasReused: connection.reused, requestHasBody: x.requestHasBody,
                                      requestEnded: x.requestEnded, alreadyRetried: x.retried), let route = x.route {
                // The pooled connection was closed by the upstream before answering: the request
                // never reached it. Retry once on a fresh connection (RFC 9110 §9.2.2).
                x.retried = true
                buffered.removeAll()
                buffered.append(.end(nil))
                responseDeadline = nil
                state = .connecting(x)
                return .connect(x, route, principal: connection.principal, pooled: false)
            }
            return respond(.error(.badGateway, "upstream closed the connection before responding"), x, upstream: nil, failure: .closedBeforeResponse)
        }
        // Mid-response: never let a truncated response look complete.
        state = .closed
        return .abort(x, upstream: nil, failure: .resetDuringResponse)
    }
}
