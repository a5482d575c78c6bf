import GatewayConfig
import HTTPProxy
import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle

/// The three listeners, bound in order: the public proxy (`server.listen`), the admin listener
/// (`server.admin_listen`), and the plain-HTTP redirect (`server.redirect_http_listen`). A bind
/// that fails closes what was bound before it and names its key.
struct Listeners: Sendable {
    let proxy: ProxyServer
    let admin: SimpleHTTPServer
    let redirect: SimpleHTTPServer?

    static func open(proxy: ProxyServer, _ c: GatewayConfiguration, group: MultiThreadedEventLoopGroup, metrics: GatewayMetrics,
                     readiness: @escaping @Sendable () -> AdminEndpoints.Readiness,
                     reload: @escaping @Sendable (_ dryRun: Bool) -> GatewayService.ReloadReport) async throws -> Listeners {
        var bound: [@Sendable () async -> Void] = []
        func bind<T: Sendable>(_ key: String, _ address: ListenAddress, _ open: () async throws -> T, close: @escaping @Sendable (T) async -> Void) async throws -> T {
            do {
                let listener = try await open()
                bound.append { await close(listener) }
                return listener
            } catch {
                for close in bound.reversed() { await close() }
                throw GatewayService.bindFailure(error, key: key, address)
            }
        }
        _ = try await bind("server.listen", c.server.listen, { try await proxy.start() }, close: { _ in await proxy.shutdown(deadline: .zero) })
        let admin = try await bind("server.admin_listen", c.server.adminListen, {
            try await SimpleHTTPServer.start(host: c.server.adminListen.host, port: c.server.adminListen.port, group: group, later: { request, loop in
                AdminEndpoints.answer(request, on: loop, metrics: metrics, readiness: readiness, reload: reload)
            })
        }, close: { await $0.close() })
        var redirect: SimpleHTTPServer? = nil
        if let listen = c.server.redirectHTTPListen {
            let rule = HTTPSRedirect(c)
            redirect = try await bind("server.redirect_http_listen", listen, {
                try await SimpleHTTPServer.start(host: listen.host, port: listen.port, group: group) { request in
                    rule.response(host: request.head.headers.first(name: "host"), target: request.head.uri)
                }
            }, close: { await $0.close() })
        }
        return Listeners(proxy: proxy, admin: admin, redirect: redirect)
    }
}

/// The listeners as a service: they serve until the group shuts down, then `/readyz` says
/// draining, new connections are still served for `server.timeouts.drain_delay`, the proxy
/// finishes in-flight requests within `server.timeouts.shutdown` (both read from the running
/// configuration: a reload may change them), and the listeners close.
struct Draining: Service {
    let listeners: Listeners
    let delay: @Sendable () -> Duration
    let deadline: @Sendable () -> Duration
    let logger: Logger
    let willDrain: @Sendable () -> Void

    func run() async {
        try? await gracefulShutdown()
        willDrain()
        let delay = delay()
        if delay > .zero {
            logger.info("shutting down: /readyz answers 503; still serving new connections until the drain", metadata: ["drain_delay": "\(ConfigDuration.format(delay))"])
            // A wait on the clock is the point: the load balancer needs this long to stop sending.
            try? await Task.sleep(for: delay)
        }
        let drain = deadline()
        logger.info("shutting down: draining in-flight requests", metadata: ["deadline": "\(ConfigDuration.format(drain))"])
        await listeners.proxy.shutdown(deadline: .init(drain))
        await listeners.admin.close()
        await listeners.redirect?.close()
    }
}
