import GatewayConfig
import HTTPProxy
import NIOCore
import NIOPosix
import Logging
import Sessions

#if canImport(Glibc)
import Glibc
#endif

/// The start-up checks `check` runs too: a file `check` passes is one `serve` starts with.
extension GatewayService {
    /// Everything `serve` does before it binds: reads and parses every secret and key file
    /// (`session.secret_file`, `apple.private_key_file`, `identity.assertion.key_file`, TLS
    /// certificates and keys, CA files) and resolves every host name (Redis, upstreams).
    /// Connects to nothing. `check` runs it, so that a file `check` passes is one `serve` starts
    /// with. Returns what is worth a warning (a certificate close to its expiry).
    @discardableResult
    public static func preflight(_ c: GatewayConfiguration, group: MultiThreadedEventLoopGroup = .singleton, logger: Logger) async throws -> [StartupFailure] {
        var warnings: [StartupFailure] = []
        if let files = c.server.tls, let warning = try TLSContexts.server(files).warning {
            warnings.append(StartupFailure(key: "server.tls.certificate_file", warning))
        }
        let parts = try GatewayComposition.build(c, group: group, metrics: GatewayMetrics(), logger: logger, now: SessionClock.now, subscribe: false)
        do {
            _ = try routing(c, Authenticator(core: parts.core, configuration: c, generation: 0))
        } catch {
            await parts.resources.close()
            throw error
        }
        await parts.resources.close()
        return warnings
    }

    /// Binds and at once closes each listen address with a fixed port: an address in use (or
    /// not local) is reported as `serve` would report it.
    public static func probeListeners(_ c: GatewayConfiguration, group: MultiThreadedEventLoopGroup = .singleton) async -> [StartupFailure] {
        var failures: [StartupFailure] = []
        let listeners = [("server.listen", c.server.listen), ("server.admin_listen", c.server.adminListen)]
            + (c.server.redirectHTTPListen.map { [("server.redirect_http_listen", $0)] } ?? [])
        for (key, address) in listeners where address.port != 0 {
            do {
                let channel = try await ServerBootstrap(group: group).serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                    .bind(host: address.host, port: address.port).get()
                try? await channel.close()
            } catch {
                failures.append(bindFailure(error, key: key, address))
            }
        }
        return failures
    }

    /// `server.listen: 127.0.0.1:8080: address already in use`.
    static func bindFailure(_ error: any Error, key: String, _ address: ListenAddress) -> StartupFailure {
        let reason: String
        if let io = error as? IOError {
            reason = String(cString: strerror(io.errnoCode))
        } else {
            reason = "\(error)"
        }
        return StartupFailure(key: key, "\(address): \(reason.lowercased())")
    }
}
