import HTTPProxy
import NIOCore

/// The admin listener (`server.admin_listen`, loopback by default): `/healthz`, `/readyz`,
/// `/metrics`. Never served on the public listener.
enum AdminEndpoints {
    /// What `/readyz` says: 503 while draining and until the session store has answered once
    /// (a replica that never reached its store is misconfigured: keep it out of rotation); 200
    /// after, also while a shared store is down (guarded routes then answer 503 themselves, and
    /// public routes keep working — taking every replica out would stop those too).
    enum Readiness: Equatable {
        case ready, storeDown, storeNeverReached, draining
    }

    static func respond(_ request: SimpleRequest, metrics: GatewayMetrics, readiness: @Sendable () -> Readiness) -> SimpleResponse {
        let path = request.head.uri.split(separator: "?", maxSplits: 1).first.map(String.init) ?? request.head.uri
        guard request.head.method == .GET || request.head.method == .HEAD else {
            return SimpleResponse(status: .methodNotAllowed, "405 use GET\n")
        }
        switch path {
        case "/healthz":
            return SimpleResponse("ok\n")
        case "/readyz":
            switch readiness() {
            case .ready: return SimpleResponse("ready\n")
            case .storeDown: return SimpleResponse("ready; the session store is unreachable: guarded routes answer 503\n")
            case .storeNeverReached: return SimpleResponse(status: .serviceUnavailable, "not ready: the session store has not answered since start\n")
            case .draining: return SimpleResponse(status: .serviceUnavailable, "not ready: shutting down\n")
            }
        case "/metrics":
            var buffer = ByteBuffer()
            buffer.writeBytes(metrics.exposition())
            return SimpleResponse(contentType: "text/plain; version=0.0.4; charset=utf-8", body: buffer)
        default:
            return SimpleResponse(status: .notFound, "404 not found (try /healthz, /readyz, /metrics)\n")
        }
    }
}
