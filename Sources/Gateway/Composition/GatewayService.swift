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

/// The gateway as one long-running `Service`, and its composition: the parts of the core
/// (`GatewayComposition`) and the listeners run as one `ServiceGroup` — the store's resources,
/// the fleet's subscriber, the store watcher, SIGHUP reloads, the listeners — which starts them
/// together and, on shutdown (SIGTERM/SIGINT through the enclosing group), stops them in reverse:
/// the listeners drain first, the store closes last.
public final class GatewayService: Service, Sendable {
    let configPath: String?
    private let initial: GatewayConfiguration
    private let group: MultiThreadedEventLoopGroup
    let logger: Logger
    public let metrics = GatewayMetrics()
    let proxy: ProxyServer
    /// The listener's certificate (`server.tls`): re-read on every reload.
    let tls: TLSTermination?
    /// The running configuration and the sign-in settings built from it: swapped together.
    let running: NIOLockedValueBox<(configuration: GatewayConfiguration, auth: Authenticator)>
    let core: AuthCore
    let parts: GatewayComposition.Parts
    private let phase = NIOLockedValueBox(Phase.starting(waiters: []))
    /// One reload at a time: the generation read, the checks and the swap are one step.
    let reloading = NIOLock()
    /// systemd's `Type=notify` (`NOTIFY_SOCKET`): ready, reloading, stopping.
    let notifier = SystemdNotifier()

    /// Where the process is, for `/readyz` and `waitUntilStarted`.
    private enum Phase {
        case starting(waiters: [CheckedContinuation<Void, Never>])
        case running(Listeners, store: StoreHealth)
        case draining(Listeners)
    }

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
        let parts = try GatewayComposition.build(configuration, group: group, metrics: metrics, logger: logger, now: clock)
        let observer = GatewayObserver(metrics: metrics, accessLog: accessLog, tracer: parts.tracer)
        let authenticator: Authenticator
        let routing: RoutingSnapshot
        do {
            authenticator = try Authenticator(core: parts.core, configuration: configuration, generation: 0)
            routing = try Self.routing(configuration, authenticator)
        } catch {
            parts.abandon()
            throw error
        }
        metrics.prime(routes: configuration.routes.map(\.name) + ["auth"], upstreams: Self.upstreamLabels(configuration))
        if let apple = parts.core.apple {
            metrics.addCollector { [metrics] in
                for id in apple.clientIDs {
                    metrics.recordClientSecret(clientID: id, expiresIn: apple.secrets.expiresIn(for: id), age: apple.secrets.age(for: id),
                                               mintFailures: apple.secrets.mintFailures)
                }
            }
        }
        self.parts = parts
        self.core = parts.core
        self.running = NIOLockedValueBox((configuration, authenticator))
        var proxyConfiguration = Self.proxyConfiguration(configuration)
        proxyConfiguration.tls = tls
        self.proxy = ProxyServer(configuration: proxyConfiguration, routing: routing, group: group, observer: observer, logger: logger)
    }

    /// The bound public address once running (tests listen on port 0).
    public var proxyAddress: SocketAddress? { proxy.localAddress }
    public var adminAddress: SocketAddress? { listeners?.admin.localAddress }
    public var redirectAddress: SocketAddress? { listeners?.redirect?.localAddress }

    private var listeners: Listeners? {
        phase.withLockedValue { phase in
            switch phase {
            case .starting: nil
            case .running(let listeners, _), .draining(let listeners): listeners
            }
        }
    }

    /// Suspends until every listener is bound and the start's checks (the first store ping, the
    /// return URL's comparison) are done.
    public func waitUntilStarted() async {
        await withCheckedContinuation { continuation in
            let resumeNow = phase.withLockedValue { phase -> Bool in
                guard case .starting(var waiters) = phase else { return true }
                waiters.append(continuation)
                phase = .starting(waiters: waiters)
                return false
            }
            if resumeNow { continuation.resume() }
        }
    }

    /// What `/readyz` says.
    private var readiness: AdminEndpoints.Readiness {
        phase.withLockedValue { phase in
            switch phase {
            case .starting: .storeNeverReached
            case .running(_, let store): store.readiness
            case .draining: .draining
            }
        }
    }

    /// Pings the store (a write, bounded by `store.timeout`); the error when it did not answer.
    private func pingStore() async -> (any Error)? {
        var failure: (any Error)? = nil
        do { _ = try await core.store.ping(on: group.next()).get() } catch { failure = error }
        metrics.storeUp.set(Double(failure == nil ? 1 : 0))
        return failure
    }

    /// The store watcher's tick: pings the store and records the answer; a change is logged and
    /// told to systemd.
    private func checkStore() async {
        let failure = await pingStore()
        let changed = phase.withLockedValue { phase -> Bool in
            guard case .running(let listeners, var store) = phase else { return false }
            let changed = store.record(answered: failure == nil)
            phase = .running(listeners, store: store)
            return changed
        }
        if changed { logStore(failure, first: false) }
    }

    /// Says what a ping found; the first ping's finding goes to systemd with READY=1 (`run`),
    /// not on its own.
    private func logStore(_ failure: (any Error)?, first: Bool) {
        if let failure {
            let fault = StoreFault(failure)
            let what = Self.outage(fault)
            logger.error("\(what): guarded routes answer 503", metadata: ["error": "\(failure)", "fault": "\(fault)"])
            if !first { notifier.status("\(what): guarded routes answer 503") }
        } else {
            logger.info("session store reachable")
            if !first { notifier.status("listening; the session store answers") }
        }
    }

    /// The store watcher's last ping answered (and the gateway is not draining): held
    /// revocations are replayed meanwhile.
    private var storeAnswers: Bool {
        phase.withLockedValue { phase in
            if case .running(_, .reachable) = phase { true } else { false }
        }
    }


    /// What an operator reads when the store stops taking writes (the log, systemd's status).
    static func outage(_ fault: StoreFault) -> String {
        switch fault {
        case .readOnly: "session store is a read-only replica (its primary was demoted: a failover)"
        case .outOfMemory: "session store is full (maxmemory) and refuses writes"
        default: "session store unreachable"
        }
    }

    /// Apple's return URL, compared with the one the fleet last started with (the store): a
    /// start that moved it is said loudly, since every sign-in fails at Apple until the new URL
    /// is registered. Said once; a store that does not answer now is not waited for.
    private func noteReturnURL() async {
        guard let url = initial.appleReturnURL else { return }
        guard let previous = try? await core.store.swapReturnURL(url, on: group.next()).get(), previous != url else { return }
        logger.error("Apple's return URL changed: register the new one with the Services ID, or every sign-in fails at Apple with invalid_request",
                     metadata: ["apple_return_url": "\(url)", "previous": "\(previous)"])
    }

    public func run() async throws {
        let listeners: Listeners
        do {
            listeners = try await Listeners.open(proxy: proxy, initial, group: group, metrics: metrics, readiness: { self.readiness },
                                                 reload: { self.reload(dryRun: $0) })
        } catch {
            await parts.resources.close()
            parts.tracer?.abandon()
            throw error
        }
        parts.resources.start()
        let reloads = configPath == nil ? nil : await SignalReloads.trapping { self.reload() }
        // Started means the first checks are done: `waitUntilStarted` (and READY=1) come after
        // the first ping and the return URL's comparison, whatever the order of the callers.
        let firstPing = await pingStore()
        await noteReturnURL()
        var store = StoreHealth()
        _ = store.record(answered: firstPing == nil)
        let waiters = phase.withLockedValue { phase -> [CheckedContinuation<Void, Never>] in
            guard case .starting(let waiters) = phase else { return [] }
            phase = .running(listeners, store: store)
            return waiters
        }
        logStore(firstPing, first: true)
        logger.info("sessiongate listening", metadata: [
            "listen": "\(tls == nil ? "http" : "https")://\(proxy.localAddress.map { "\($0)" } ?? "-")",
            "admin": "\(listeners.admin.localAddress.map { "\($0)" } ?? "-")",
            "redirect_http": "\(listeners.redirect?.localAddress.map { "\($0)" } ?? "-")",
            "routes": .stringConvertible(initial.routes.count),
            // What must be registered with the Services ID: a restart that moves it is said here.
            "apple_return_url": "\(initial.appleReturnURL ?? "-")",
        ])
        waiters.forEach { $0.resume() }
        notifier.ready(status: readiness == .ready ? "listening; the session store answered"
            : "listening; the session store has not answered yet: guarded routes answer 503 until it does")

        // Started together; stopped in reverse order of this list: the tracer last, exporting
        // what everything before it recorded.
        var services: [any Service] = parts.tracer.map { [$0] } ?? []
        services.append(parts.resources)
        if let subscriber = parts.subscriber { services.append(subscriber) }
        services.append(PeriodicTask(every: .seconds(1)) {
            await self.checkStore()
            self.metrics.collectProcessMetrics()
        })
        // The revocations the store did not take, applied while it answers: beside the
        // watcher, whose once-a-second truth a long replay must not hold up.
        services.append(PeriodicTask(every: .seconds(1)) {
            let held = self.core.revocations.held
            held.recordMetrics()
            if self.storeAnswers { await held.replay() }
        })
        if let reloads { services.append(reloads) }
        services.append(Draining(listeners: listeners, delay: { self.running.withLockedValue { $0.configuration.server.timeouts.drainDelay } },
                                 deadline: { self.running.withLockedValue { $0.configuration.server.timeouts.shutdown } },
                                 logger: logger) {
            self.notifier.stopping()
            self.phase.withLockedValue { $0 = .draining(listeners) }
        })
        try await ServiceGroup(configuration: .init(services: services, logger: logger)).run()
        logger.info("stopped")
    }
}
