import HTTPProxy
import NIOCore

/// The admin listener (`server.admin_listen`, loopback by default): `/healthz`, `/readyz`,
/// `/metrics`. Never served on the public listener.
enum AdminEndpoints {
    static func respond(_ request: SimpleRequest, metrics: GatewayMetrics, ready: @Sendable () -> Bool) -> SimpleResponse {
        let path = request.head.uri.split(separator: "?", maxSplits: 1).first.map(String.init) ?? request.head.uri
        guard request.head.method == .GET || request.head.method == .HEAD else {
            return SimpleResponse(status: .methodNotAllowed, "405 use GET\n")
        }
        switch path {
        case "/healthz":
            return SimpleResponse("ok\n")
        case "/readyz":
            return ready() ? SimpleResponse("ready\n") : SimpleResponse(status: .serviceUnavailable, "not ready\n")
        case "/metrics":
            var buffer = ByteBuffer()
            buffer.writeBytes(metrics.exposition())
            return SimpleResponse(contentType: "text/plain; version=0.0.4; charset=utf-8", body: buffer)
        default:
            return SimpleResponse(status: .notFound, "404 not found (try /healthz, /readyz, /metrics)\n")
        }
    }
}
