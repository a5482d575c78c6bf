import GatewayConfig
import HTTPProxy
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ServiceLifecycle
import Sessions
import UnixSignals

#if canImport(Glibc)
import Glibc
#endif

/// The gateway as one long-running `Service`: the public proxy listener and the admin listener,
/// configuration reloads on SIGHUP, and a graceful drain on shutdown (SIGTERM/SIGINT through the
/// `ServiceGroup`).
public final class GatewayService: Service, Sendable {
    private let configPath: String?
    private let initial: GatewayConfiguration
    private let group: MultiThreadedEventLoopGroup
    private let logger: Logger
    public let metrics = GatewayMetrics()
    private let proxy: ProxyServer
    private let admin = NIOLockedValueBox<SimpleHTTPServer?>(nil)
    private let redirect = NIOLockedValueBox<SimpleHTTPServer?>(nil)
    /// The listener's certificate (`server.tls`): re-read on every reload.
    private let tls: TLSTermination?
    /// The running configuration and the sign-in settings built from it: swapped together.
    private let running: NIOLockedValueBox<(configuration: GatewayConfiguration, auth: Authenticator)>
    private let started = NIOLockedValueBox(false)
    private let startedWaiters = NIOLockedValueBox<[CheckedContinuation<Void, Never>]>([])
    /// Sign-in and admission under the running configuration (a reload makes a new one over
    /// the same `AuthCore`: sessions, store, Apple).
    var authenticator: Authenticator { running.withLockedValue { $0.auth } }
    private let core: AuthCore

    /// Resolves upstream host names (blocking; not on an event loop): a name that does not
    /// resolve is an error, as in nginx.
    /// - Parameters:
    ///   - configPath: re-read on SIGHUP; `nil` disables reloads.
    ///   - clock: Unix milliseconds for session times (tests move it; default: the wall clock).
    public init(configuration: GatewayConfiguration, configPath: String?, group: MultiThreadedEventLoopGroup = .singleton, logger: Logger,
                clock: @escaping @Sendable () -> Int64 = SessionClock.now) throws {
        self.configPath = configPath
        self.initial = configuration
        self.group = group
        self.logger = logger
        let accessLog: AccessLog?
        switch configuration.server.accessLog {
        case .off: accessLog = nil
        case .text: accessLog = AccessLog(format: .text, sink: .standardOutput)
        case .json: accessLog = AccessLog(format: .json, sink: .standardOutput)
        }
        let observer = GatewayObserver(metrics: metrics, accessLog: accessLog)
        // Read before anything that must be closed on failure is made.
        if let files = configuration.server.tls {
            let certificate = try TLSContexts.server(files)
            if let warning = certificate.warning { logger.warning("server.tls.certificate_file: \(warning)") }
            metrics.primeTLS()
            metrics.recordCertificateExpiry(certificate.notValidAfter)
            tls = TLSTermination(context: certificate.context, handshakeTimeout: .init(configuration.server.timeouts.tlsHandshake))
        } else {
            tls = nil
        }
        let authenticator = try Authenticator(configuration: configuration, group: group, metrics: metrics, logger: logger, now: clock)
        metrics.prime(routes: configuration.routes.map(\.name) + ["auth"])
        if let apple = authenticator.core.apple {
            metrics.addCollector { [metrics] in
                for id in apple.clientIDs {
                    metrics.recordClientSecret(clientID: id, expiresIn: apple.secrets.expiresIn(for: id), age: apple.secrets.age(for: id),
                                               mintFailures: apple.secrets.mintFailures)
                }
            }
        }
        self.core = authenticator.core
        self.running = NIOLockedValueBox((configuration, authenticator))
        let routing: RoutingSnapshot
        do { routing = try Self.routing(configuration, authenticator) } catch {
            authenticator.core.abandon()
            throw error
        }
        var proxyConfiguration = Self.proxyConfiguration(configuration)
        proxyConfiguration.tls = tls
        self.proxy = ProxyServer(configuration: proxyConfiguration, routing: routing, group: group, observer: observer, logger: logger)
    }

    static func proxyConfiguration(_ c: GatewayConfiguration) -> ProxyConfiguration {
        ProxyConfiguration(
            listen: c.server.listen,
            timeouts: .init(upstreamConnect: .init(c.server.timeouts.upstreamConnect),
                            upstreamResponse: .init(c.server.timeouts.upstreamResponse),
                            idle: .init(c.server.timeouts.idle), requestBody: .init(c.server.timeouts.requestBody),
                            requestHead: .init(c.server.timeouts.requestHead)),
            limits: ProxyLimits(maxHeaderBytes: c.server.limits.maxHeaderBytes, maxHeaderCount: c.server.limits.maxHeaderCount,
                                maxConnections: c.server.limits.maxConnections, maxConnectionsPerClient: c.server.limits.maxConnectionsPerClient))
    }

    /// Routes as the proxy sees them, upstream names resolved, each with its session guard; the
    /// auth endpoints (`server.auth_prefix`) come first for every host.
    static func routing(_ c: GatewayConfiguration, _ auth: Authenticator) throws -> RoutingSnapshot {
        let routes = try c.routes.enumerated().map { index, route in
            var address: UpstreamAddress
            do {
                address = try UpstreamAddress(host: route.upstream.host, port: route.upstream.port).resolved()
            } catch {
                throw StartupFailure(key: "routes[\(index)].upstream", "the host '\(route.upstream.host)' does not resolve")
            }
            address.tls = try TLSContexts.upstream(route, index: index)
            return ProxyRoute(name: route.name, host: route.host, pathPrefix: route.pathPrefix, upstream: address,
                              requestGuard: SessionGuard(auth: auth, route: route),
                              maxBodyBytes: route.maxBodyBytes ?? c.server.limits.maxBodyBytes, allowTrace: route.allowTrace,
                              stripPrefix: route.stripPrefix, upstreamHost: route.upstreamHost, upstreamReuse: route.upstreamReuse,
                              maxInFlight: route.maxInFlight)
        }
        // The endpoints answer locally; their upstream address is never dialled.
        let endpoints = AuthEndpointGuard(auth: auth, origins: origins(c), trustedProxies: c.server.trustedProxies)
        let hosts = Set(c.routes.map(\.host))
        let authRoutes = hosts.map { host in
            ProxyRoute(name: "auth", host: host, pathPrefix: c.server.authPrefix + "/", upstream: UpstreamAddress(host: "127.0.0.1", port: 9),
                       requestGuard: endpoints)
        }
        return RoutingSnapshot(routes: authRoutes + routes, identityHeaders: c.identity.headers.all + c.identity.stripHeaders, identityPrefix: c.identity.headerPrefix,
                               trustedProxies: c.server.trustedProxies, hiddenCookies: [auth.cookieName, auth.loginCookieName],
                               origins: origins(c))
    }

    // MARK: start-up checks (`check` runs them too)

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
        let core = try AuthCore(configuration: c, group: group, metrics: GatewayMetrics(), logger: logger)
        do {
            _ = try routing(c, Authenticator(core: core, configuration: c, generation: 0))
        } catch {
            await core.shutdown()
            throw error
        }
        await core.shutdown()
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

    /// Who may open WebSockets and post to the gateway's endpoints besides the request's own host.
    static func origins(_ c: GatewayConfiguration) -> OriginPolicy {
        OriginPolicy(allowedOrigins: (c.server.publicURL.map { [$0] } ?? []) + c.server.allowedOrigins)
    }

    /// The bound public address once running (tests listen on port 0).
    public var proxyAddress: SocketAddress? { proxy.localAddress }
    public var adminAddress: SocketAddress? { admin.withLockedValue { $0?.localAddress } }
    public var redirectAddress: SocketAddress? { redirect.withLockedValue { $0?.localAddress } }

    /// Suspends until both listeners are bound.
    public func waitUntilStarted() async {
        if started.withLockedValue({ $0 }) { return }
        await withCheckedContinuation { continuation in
            let resumeNow = started.withLockedValue { isStarted -> Bool in
                if isStarted { return true }
                startedWaiters.withLockedValue { $0.append(continuation) }
                return false
            }
            if resumeNow { continuation.resume() }
        }
    }

    /// `/readyz`: listeners up and the session store answering (pinged every second).
    /// nil until the first check: whatever it finds is logged.
    private let storeReachable = NIOLockedValueBox<Bool?>(nil)
    private let storeEverReached = NIOLockedValueBox(false)
    private let draining = NIOLockedValueBox(false)

    private var readiness: AdminEndpoints.Readiness {
        if draining.withLockedValue({ $0 }) { return .draining }
        if storeReachable.withLockedValue({ $0 }) == true { return .ready }
        return storeEverReached.withLockedValue { $0 } ? .storeDown : .storeNeverReached
    }

    private func checkStore() async {
        let loop = group.next()
        var failure: (any Error)? = nil
        do { _ = try await core.withDeadline(core.store.ping(on: loop), on: loop).get() } catch { failure = error }
        let ok = failure == nil
        if ok { storeEverReached.withLockedValue { $0 = true } }
        metrics.storeUp.set(Double(ok ? 1 : 0))
        let was = storeReachable.withLockedValue { old in defer { old = ok }; return old }
        if was != ok {
            if let failure {
                logger.error("session store unreachable: guarded routes answer 503", metadata: ["error": "\(failure)"])
            } else {
                logger.info("session store reachable")
            }
        }
    }

    private func watchStore() async {
        while !Task.isCancelled {
            try? await Task.sleep(for: .seconds(1))
            await checkStore()
            metrics.collectProcessMetrics()
        }
    }

    public func run() async throws {
        let address: SocketAddress
        do { address = try await proxy.start() } catch {
            await core.shutdown()
            throw Self.bindFailure(error, key: "server.listen", initial.server.listen)
        }
        let metrics = self.metrics
        let adminServer: SimpleHTTPServer
        do {
            adminServer = try await SimpleHTTPServer.start(
                host: initial.server.adminListen.host, port: initial.server.adminListen.port, group: group
            ) { request in
                AdminEndpoints.respond(request, metrics: metrics, readiness: { self.readiness })
            }
        } catch {
            await proxy.shutdown(deadline: .zero)
            await core.shutdown()
            throw Self.bindFailure(error, key: "server.admin_listen", initial.server.adminListen)
        }
        admin.withLockedValue { $0 = adminServer }
        if let listen = initial.server.redirectHTTPListen {
            let rule = HTTPSRedirect(initial)
            do {
                let server = try await SimpleHTTPServer.start(host: listen.host, port: listen.port, group: group) { request in
                    rule.response(host: request.head.headers.first(name: "host"), target: request.head.uri)
                }
                redirect.withLockedValue { $0 = server }
            } catch {
                await adminServer.close()
                await proxy.shutdown(deadline: .zero)
                await core.shutdown()
                throw Self.bindFailure(error, key: "server.redirect_http_listen", listen)
            }
        }
        core.start()
        await checkStore()
        logger.info("sessiongate listening", metadata: [
            "listen": "\(tls == nil ? "http" : "https")://\(address)", "admin": "\(adminServer.localAddress.map { "\($0)" } ?? "-")",
            "redirect_http": "\(redirectAddress.map { "\($0)" } ?? "-")",
            "routes": "\(initial.routes.count)",
        ])
        let waiters = started.withLockedValue { isStarted in
            isStarted = true
            return startedWaiters.withLockedValue { w in defer { w.removeAll() }; return w }
        }
        waiters.forEach { $0.resume() }

        await withDiscardingTaskGroup { tasks in
            if configPath != nil {
                tasks.addTask { await self.reloadOnSIGHUP() }
            }
            tasks.addTask { await self.watchStore() }
            try? await gracefulShutdown()
            tasks.cancelAll()
        }
        draining.withLockedValue { $0 = true }
        let drain = running.withLockedValue { $0.configuration.server.timeouts.shutdown }
        logger.info("shutting down: draining in-flight requests", metadata: ["deadline": "\(ConfigDuration.format(drain))"])
        await proxy.shutdown(deadline: .init(drain))
        await adminServer.close()
        await redirect.withLockedValue { $0 }?.close()
        await core.shutdown()
        logger.info("stopped")
    }

    private func reloadOnSIGHUP() async {
        for await _ in await UnixSignalsSequence(trapping: .sighup) {
            if Task.isCancelled { return }
            reload()
        }
    }

    public enum ReloadOutcome: String, Sendable {
        /// The new configuration runs for every new request.
        case applied = "ok"
        /// The file has errors (or names an upstream that does not resolve): nothing changed.
        case invalid
        /// The file changes keys that apply only at restart: nothing changed.
        case refused
    }

    /// Re-reads the configuration file and swaps the whole running configuration (routes, header
    /// rules, identity header names, auth prefix, allow lists, session lifetimes) as one value for
    /// new requests, or changes nothing: an invalid file, or one that changes a key of
    /// `ReloadRules.restartOnly`, keeps the running configuration, each reason logged with its
    /// `file:line:col`.
    @discardableResult
    public func reload() -> ReloadOutcome {
        guard let configPath else { return .invalid }
        // One reload at a time: the generation read, the checks and the swap are one step.
        let outcome = reloading.withLock { attemptReload(configPath) }
        switch outcome {
        case .applied: metrics.reloadsSucceeded.increment()
        case .invalid: metrics.reloadsFailed.increment()
        case .refused: metrics.reloadsRefused.increment()
        }
        return outcome
    }

    private let reloading = NIOLock()

    /// Called with `reloading` held. Resolves upstream names (blocking): never on an event loop.
    private func attemptReload(_ configPath: String) -> ReloadOutcome {
        let result = GatewayConfiguration.load(file: configPath)
        for problem in result.problems {
            logger.log(level: problem.severity == .error ? .error : .warning, "\(configPath):\(problem)")
        }
        guard let next = result.configuration else {
            logger.error("configuration reload rejected: the file has errors; the running configuration stays",
                         metadata: ["file": "\(configPath)", "errors": "\(result.errors.count)"])
            return .invalid
        }
        let (previous, generation) = running.withLockedValue { ($0.configuration, $0.auth.generation) }
        let refusal = ReloadRules.refusal(running: previous, next: next, locations: result.locations)
            + core.changedSecrets(next, locations: result.locations)
        guard refusal.isEmpty else {
            for problem in refusal { logger.error("\(configPath):\(problem)") }
            logger.error("configuration reload refused: keys that apply only at restart changed; the running configuration stays",
                         metadata: ["file": "\(configPath)", "keys": "\(refusal.map(\.path).joined(separator: ","))"])
            return .refused
        }
        let auth: Authenticator
        let routing: RoutingSnapshot
        var certificate: TLSContexts.ServerCertificate? = nil
        do {
            // The certificate is re-read on every reload (certbot renews it in place).
            if let files = next.server.tls { certificate = try TLSContexts.server(files) }
            auth = try Authenticator(core: core, configuration: next, generation: generation + 1)
            routing = try Self.routing(next, auth)
        } catch {
            if let failure = error as? StartupFailure {
                logger.error("\(configPath):\(failure.problem(locations: result.locations))")
            } else {
                logger.error("\(configPath): \(error)")
            }
            logger.error("configuration reload rejected; the running configuration stays", metadata: ["file": "\(configPath)"])
            return .invalid
        }
        metrics.prime(routes: next.routes.map(\.name))
        running.withLockedValue { $0 = (next, auth) }
        auth.activate()
        proxy.replaceRouting(routing)
        if let certificate {
            tls?.replace(certificate.context)
            metrics.recordCertificateExpiry(certificate.notValidAfter)
            if let warning = certificate.warning { logger.warning("server.tls.certificate_file: \(warning)") }
        }
        logger.info("configuration reloaded", metadata: ["file": "\(configPath)", "routes": "\(next.routes.count)"])
        return .applied
    }
}
