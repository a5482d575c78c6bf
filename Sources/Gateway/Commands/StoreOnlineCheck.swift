import GatewayConfig
import Logging
import NIOCore
import NIOPosix
import Sessions

/// `sessiongate check --online`, the store (issue 28 §1): connects exactly as `serve` will (TLS,
/// the ACL user and password, the database, Sentinel or Cluster discovery), writes, reads and
/// deletes a test key under the key prefix and loads the scripts (`RedisSessionStore.check`).
/// A failure names the step and the key to fix, so that a store `check --online` passes is one
/// every guarded route can use.
public enum StoreOnlineCheck {
    public enum Outcome: Sendable {
        /// The line to print, and problems that do not fail the check.
        case ok(warnings: [StartupFailure] = [], String)
        case failed(StartupFailure)
    }

    /// Per command: a first connection may be slow where serve's store.timeout is tight; the
    /// check proves the settings, not the latency.
    static let timeout = TimeAmount.seconds(5)

    public static func run(_ c: GatewayConfiguration, logger: Logger) async -> Outcome {
        guard let url = c.store.redisURL else { return .ok("ok: store: memory (in the process), nothing to check online") }
        let backend: RedisSessionBackend
        do {
            let endpoint = try StoreConnection.endpoint(c.store, commandTimeout: timeout)!  // redis_url is set
            backend = try StoreConnection.backend(endpoint, c.store, group: MultiThreadedEventLoopGroup.singleton, logger: logger)
        } catch let failure as StartupFailure {
            return .failed(failure)
        } catch {
            return .failed(StartupFailure(key: "store.redis_url", "\(error)"))
        }
        let loop = MultiThreadedEventLoopGroup.singleton.any()
        let failure = await backend.store.check(on: loop)
        let recorded = failure == nil ? try? await backend.store.returnURL(on: loop).get() : nil
        await backend.shutdown()
        if let failure { return .failed(explain(failure, c.store)) }
        var warnings: [StartupFailure] = []
        if let url = c.appleReturnURL, let recorded, recorded != url {
            warnings.append(StartupFailure(key: "server.public_url", "Apple's return URL moves from \(recorded) (the fleet's, in the store) to "
                + "\(url): register it with the Services ID before the gateways restart, or every sign-in fails at Apple"))
        }
        let deployment = c.store.cluster != nil ? "Redis Cluster" : c.store.sentinel != nil ? "Redis behind Sentinel (\(c.store.sentinel!.masterName))" : "Redis"
        return .ok(warnings: warnings, "ok: store: \(deployment) at \(url.tls ? "rediss" : "redis")://…:\(url.port)/\(url.database): connected, wrote, read and deleted "
            + "\(c.store.keyPrefix)check:{…}, loaded the scripts")
    }

    /// The key an operator fixes for a failed step, and what went wrong in their terms.
    static func explain(_ failure: StoreCheckFailure, _ store: GatewayConfiguration.Store) -> StartupFailure {
        let step = failure.step.rawValue
        let addresses = store.cluster != nil ? "store.cluster.addresses" : store.sentinel != nil ? "store.sentinel.addresses" : "store.redis_url"
        let detail = failure.detail
        switch failure.fault {
        case .authentication:
            return StartupFailure(key: "store.redis_url", "\(step): Redis refused the user or password in the URL (\(detail))")
        case .noDatabase:
            return StartupFailure(key: "store.redis_url", "\(step): Redis has no database \(store.redisURL?.database ?? 0) (\(detail))")
        case .noPermission:
            return StartupFailure(key: "store.redis_url", "\(step): the Redis user's ACL does not allow it (\(detail)); "
                + "the gateway needs reads, writes, pub/sub and scripting on keys under store.key_prefix")
        case .refusedCommand:
            return StartupFailure(key: "store.redis_url", "\(step): the server refuses the command, renamed or disabled (\(detail))")
        case .readOnly where store.sentinel != nil:
            return StartupFailure(key: "store.sentinel.master_name", "\(step): the server the sentinels name is not a master")
        case .readOnly:
            return StartupFailure(key: addresses, "\(step): the server is a read-only replica; the gateway needs the master (\(detail))")
        case .loading, .busy, .outOfMemory, .other:
            return StartupFailure(key: "store.redis_url", "\(step): Redis answered \(detail)")
        case .untrustedCertificate:
            return StartupFailure(key: "store.tls.ca_file", "\(step): the server's certificate is not signed by this CA, or does not name the host (\(detail))")
        case .tlsHandshake:
            return StartupFailure(key: "store.tls.certificate_file",
                                  "\(step): the TLS handshake failed; a server with tls-auth-clients needs our client certificate (\(detail))")
        case .unknownMaster:
            return StartupFailure(key: "store.sentinel.master_name", "\(step): no sentinel knows a master named '\(store.sentinel?.masterName ?? "")'")
        case .noSentinel:
            return StartupFailure(key: "store.sentinel.addresses", "\(step): \(detail)")
        case .timeout:
            return StartupFailure(key: addresses, "\(step): no answer within \(timeout.nanoseconds / 1_000_000_000) s")
        case .unreachable:
            return StartupFailure(key: addresses, "\(step): cannot reach Redis (\(detail)); the log line above says why")
        }
    }
}
