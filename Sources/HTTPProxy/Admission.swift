import NIOCore
import NIOHTTP1

/// The protocol-independent first step of every exchange: from a received request head to the
/// question for the route's guard, or to the answer the gateway gives without asking it.
///
/// The head is a `WireHead`: the byte views of an HTTP/1 head as received, or of an HTTP/2
/// header block presented as one (`HTTP2RequestHead`) after HTTP/2's own rules. Whatever
/// carried the request, the same rules run in the same order: CONNECT, the header rules
/// (framing, hop-by-hop, identity and forwarding headers), the target, the route, TRACE, the
/// WebSocket origin, a declared body too large. The guard then sees a `GuardRequest`, never a
/// protocol type.
enum Admission {
    /// A request the guard is to decide.
    struct Admitted {
        var inbound: InboundRequest
        var target: RequestTarget
        var route: ProxyRoute
        /// The routing snapshot it was admitted under (its header rules apply to the response).
        var snapshot: RoutingSnapshot

        /// What the route's guard is asked.
        func guardRequest(clientAddress: SocketAddress?, trace: ExchangeSpans?) -> GuardRequest {
            var request = GuardRequest(wire: inbound.head, target: target, routeName: route.name, clientAddress: clientAddress, host: inbound.host,
                                       isWebSocketUpgrade: inbound.isWebSocketUpgrade, hasBearer: inbound.hasBearer)
            if let trace {
                request.trace = trace.admission
                request.requestSpanID = trace.context.spanID
            }
            return request
        }
    }

    /// A request answered without the guard: `inbound` when the header rules read it (its
    /// framing and `Connection` are known), `path` when its target parsed.
    struct Refusal {
        var response: LocalResponse
        var inbound: InboundRequest? = nil
        var path: String? = nil
    }

    enum Outcome {
        case admitted(Admitted)
        case refused(Refusal)

        /// The request goes to an `upstream_reuse: echo` route (its `X-Request-Id` is the gateway's).
        var echoesRequestID: Bool {
            if case .admitted(let admitted) = self { return admitted.route.upstreamReuse == .echo }
            return false
        }

        /// The request as the header rules read it, when they could.
        var inbound: InboundRequest? {
            switch self {
            case .admitted(let admitted): return admitted.inbound
            case .refused(let refusal): return refusal.inbound
            }
        }
    }

    static func admit(_ head: WireHead, snapshot: RoutingSnapshot, peerTrusted: Bool) -> Outcome {
        if head.method == .CONNECT {
            // A tunnel to wherever the client names is not what a gateway in front of an app
            // offers (nginx answers 405 too).
            return .refused(Refusal(response: methodNotAllowed("CONNECT is not proxied")))
        }
        let inbound: InboundRequest
        switch snapshot.rules.inspect(head, peerTrusted: peerTrusted) {
        case .success(let value): inbound = value
        case .failure(.badRequest(let reason)): return .refused(Refusal(response: .error(.badRequest, reason, close: true)))
        case .failure(.expectationFailed):
            return .refused(Refusal(response: .error(.expectationFailed, "only Expect: 100-continue is supported", close: true)))
        }
        let target: RequestTarget
        switch RequestTarget.parse(head.target, host: inbound.host) {
        case .success(let t): target = t
        case .failure(let rejection): return .refused(Refusal(response: .error(.badRequest, rejection.rawValue, close: true), inbound: inbound))
        }
        guard let route = snapshot.table.match(host: inbound.host, path: target.path) else {
            return .refused(Refusal(response: .error(.notFound, "no route for this host and path"), inbound: inbound, path: target.path))
        }
        if head.method == .TRACE, !route.allowTrace {
            var response = methodNotAllowed("TRACE is not forwarded on this route")
            response.close = false
            return .refused(Refusal(response: response, inbound: inbound, path: target.path))
        }
        if inbound.isWebSocketUpgrade, !snapshot.origins.admits(origin: head.firstValue(named: "origin"), host: inbound.host) {
            return .refused(Refusal(response: .error(.forbidden, "cross-origin WebSocket handshake refused", close: true), inbound: inbound,
                                    path: target.path))
        }
        if route.maxBodyBytes > 0, case .contentLength(let length) = inbound.framing, length > route.maxBodyBytes {
            return .refused(Refusal(response: .error(.payloadTooLarge, "request body larger than \(route.maxBodyBytes) bytes", close: true),
                                    inbound: inbound, path: target.path))
        }
        return .admitted(Admitted(inbound: inbound, target: target, route: route, snapshot: snapshot))
    }

    /// 405 with `Allow` (RFC 9110 §15.5.6), closing the connection.
    static func methodNotAllowed(_ reason: String) -> LocalResponse {
        var response = LocalResponse.error(.methodNotAllowed, reason, close: true)
        response.headers.append(("allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"))
        return response
    }
}
