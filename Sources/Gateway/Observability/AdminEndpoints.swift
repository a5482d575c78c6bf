import HTTPProxy
import NIOCore
import NIOHTTP1
import NIOPosix

/// The admin listener (`server.admin_listen`, loopback by default): `/healthz`, `/readyz`,
/// `/metrics`, and `POST /reload` (`sessiongate reload`, `check --reload`). Never served on the
/// public listener.
enum AdminEndpoints {
    /// What `/readyz` says: 503 while draining and until the session store has answered once
    /// (a replica that never reached its store is misconfigured: keep it out of rotation); 200
    /// after, also while a shared store is down (guarded routes then answer 503 themselves, and
    /// public routes keep working — taking every replica out would stop those too).
    enum Readiness: Equatable {
        case ready, storeDown, storeNeverReached, draining
    }

    /// `POST /reload` reloads the configuration file as SIGHUP does and answers the outcome:
    /// 200, 409 (restart-only keys changed) or 422 (the file has errors), the reasons one
    /// `file:line:col: error:` line each. `?dry_run=1` runs every check but swaps nothing. A
    /// request with an `Origin` (a browser's, from a page) is refused: only tools reload.
    static func answer(_ request: SimpleRequest, on loop: any EventLoop, metrics: GatewayMetrics, readiness: @escaping @Sendable () -> Readiness,
                       reload: @escaping @Sendable (_ dryRun: Bool) -> GatewayService.ReloadReport) -> EventLoopFuture<SimpleResponse> {
        let parts = request.head.uri.split(separator: "?", maxSplits: 1)
        guard parts.first == "/reload" else { return loop.makeSucceededFuture(respond(request, metrics: metrics, readiness: readiness)) }
        guard request.head.method == .POST else { return loop.makeSucceededFuture(SimpleResponse(status: .methodNotAllowed, "405 use POST\n")) }
        guard !request.head.headers.contains(name: "origin") else {
            return loop.makeSucceededFuture(SimpleResponse(status: .forbidden, "403 a reload is not asked for from a web page\n"))
        }
        let dryRun = parts.count == 2 && parts[1].split(separator: "&").contains("dry_run=1")
        // Blocking (names are resolved): on the thread pool, never on the loop.
        return NIOThreadPool.singleton.runIfActive(eventLoop: loop) { reload(dryRun) }.map { report in
            let (status, first): (HTTPResponseStatus, String)
            switch report.outcome {
            case .applied: (status, first) = (.ok, dryRun ? "ok: \(report.file) would reload" : "ok: configuration reloaded from \(report.file)")
            case .refused: (status, first) = (.conflict, "refused: \(report.file) changes keys that apply only at restart; the running configuration stays")
            case .invalid: (status, first) = (.unprocessableEntity, "rejected: \(report.file) has errors; the running configuration stays")
            }
            return SimpleResponse(status: status, ([first] + report.problems).joined(separator: "\n") + "\n")
        }
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
            return SimpleResponse(status: .notFound, "404 not found (try /healthz, /readyz, /metrics, POST /reload)\n")
        }
    }
}
