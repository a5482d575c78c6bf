import AppleID
import AsyncHTTPClient
import GatewayConfig
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ServiceLifecycle
import Sessions

/// The composition root: the process's parts, each built here from values (the start
/// configuration and the parts built before it), in dependency order. Nothing else constructs
/// a dependency of another part. The gateway, `check` and the operator commands all build
/// their core here, so they reach the store, Apple and the app the same way.
enum GatewayComposition {
    /// The core and what runs beside it: the subscriber to the fleet's channel (Redis only),
    /// and what holds connections open.
    struct Parts: Sendable {
        let core: AuthCore
        let subscriber: FleetSubscriber?
        let resources: CoreResources
        /// `tracing`: a service of its own, stopped after everything that records spans.
        let tracer: GatewayTracer?

        /// For a process that will not run: closes what the parts hold, exporting nothing.
        func abandon() {
            resources.abandon()
            tracer?.abandon()
        }
    }

    /// Reads every secret first, then makes what must be closed (the store's connections, the
    /// HTTP client): a failure leaves nothing open. Connects nothing yet (Redis connects on
    /// first use).
    /// - Parameter subscribe: listen to the fleet's channel, and trace (the gateway; not a one-shot command).
    static func build(_ c: GatewayConfiguration, group: MultiThreadedEventLoopGroup, metrics: GatewayMetrics, logger: Logger,
                      now: @escaping @Sendable () -> Int64, subscribe: Bool = true) throws -> Parts {
        var secrets = try StartupSecrets(c)
        let endpoint = try StoreConnection.endpoint(c.store, commandTimeout: TimeAmount(c.store.timeout))
        let cache = LocalSessionCache<CachedSession>(ttl: TimeAmount(c.store.localCacheTTL), capacity: c.store.localCacheEntries)
        metrics.addCollector { [weak cache, unowned metrics] in
            guard let cache else { return }
            let (entries, evictions) = cache.statistics
            metrics.recordSessionCache(entries: entries, evictions: evictions)
        }
        // Revocations the store does not take wait here: on disk with store.state_dir, for the
        // gateway only (a one-shot command checks the directory: it holds nothing and must not
        // take the journal's lock).
        let held: HeldRevocations
        do {
            let directory = HeldJournal.directory(configured: c.store.stateDir)
            if !subscribe, let directory { try HeldJournal.check(directory) }
            let journal = subscribe ? try directory.map { try HeldJournal(directory: $0) } : nil
            held = try HeldRevocations(journal: journal, metrics: metrics, logger: logger, now: now)
        } catch {
            throw StartupFailure(key: "store.state_dir", "\(error)")
        }

        // The gateway's only (a one-shot command traces nothing).
        let tracer: GatewayTracer?
        if subscribe, let t = c.tracing {
            let exporter: any SpanExporter
            switch t.exportProtocol {
            case .httpProtobuf: exporter = OTLPHTTPExporter(t, group: group)
            case .grpc:
                do {
                    exporter = try OTLPGRPCExporter(t, group: group)
                } catch {
                    throw StartupFailure(key: "tracing.endpoint", "no TLS for the collector: \(error)")
                }
            }
            tracer = GatewayTracer(t, exporter: exporter, metrics: metrics, logger: logger)
        } else {
            tracer = nil
        }
        // Apple's endpoints and the app's event receiver share one HTTP client.
        let http: HTTPClient? = c.apple != nil || c.events.isEnabled ? {
            var configuration = HTTPClient.Configuration(timeout: .init(connect: .seconds(5)))
            configuration.connectionPool = .init(idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: Revalidator.concurrentAppleCalls)
            return HTTPClient(eventLoopGroupProvider: .shared(group), configuration: configuration)
        }() : nil
        let apple: AppleServices?
        let backend: RedisSessionBackend?
        let signals: AsyncStream<FleetSubscriber.Signal>?
        do {
            if let a = c.apple, let http {
                let services = try AppleServices(configuration: a, httpClient: http, logger: logger)
                secrets.record("apple.private_key_file", services.keyDigest)
                // Minted now, not at the first sign-in: the key is proven at start and the
                // secret's expiry is a metric from the first scrape.
                for id in services.clientIDs { _ = services.secrets.secret(for: id) }
                apple = services
            } else {
                apple = nil
            }
            if let endpoint {
                let listener = subscribe ? FleetSubscriber.listener(on: group.next()) : nil
                backend = try StoreConnection.backend(endpoint, c.store, group: group, logger: logger, listener: listener?.0)
                signals = listener?.1
            } else {
                backend = nil
                signals = nil
            }
        } catch {
            try? http?.syncShutdown()
            tracer?.abandon()
            throw error
        }

        let store = GatewayStore(backend?.store ?? MemorySessionStore(now: now), timeout: TimeAmount(c.store.timeout), metrics: metrics,
                                 traced: tracer != nil)
        let fleet = FleetPublisher(backend: backend, logger: logger)
        let backgroundLoop = group.next()
        // An attempt's claim outlives its slowest call (Apple's or the app's), with margin.
        let slowest = max(Authenticator.milliseconds(c.apple?.timeout ?? .seconds(5)), Authenticator.milliseconds(c.events.timeout))
        let outbox = Outbox(store: store, loop: backgroundLoop, now: now, attemptTTL: slowest + 10_000, metrics: metrics, logger: logger)
        if let apple {
            let job = AppleRevocationJob(apple: apple, keys: secrets.sessionKeys, metrics: metrics, logger: logger)
            // Traced, each attempt is a trace of its own: the store's reads and Apple's call under it.
            outbox.register(.appleRevoke) { queued, loop in
                await TraceScope.root(tracer, "outbox.apple_revoke") {
                    let result = await job.run(queued, on: loop)
                    return (result, result == .done ? nil : "not done: retried later")
                }
            }
        }
        let issuer = c.server.publicURL ?? "http://\(c.server.listen)"
        let signer = secrets.assertionKeyPEM.flatMap { try? IdentityAssertionSigner(pem: $0, issuer: issuer, ttl: 60) }
        let events = AppEvents(c.events, signer: signer, outbox: outbox, now: now, logger: logger)
        if events != nil, let signer, let http {
            let timeout = TimeAmount(c.events.timeout)
            outbox.register(.event) { job, _ in await AppEvents.deliver(job, signer: signer, now: now(), http: http, timeout: timeout, tracer: tracer, logger: logger) }
        }
        let tunnels = TunnelRegistry()
        let revocations = Revocations(store: store, held: held, cache: cache, fleet: fleet, tunnels: tunnels, events: events, metrics: metrics, logger: logger,
                                      now: now, backgroundLoop: backgroundLoop)
        let revalidator: Revalidator? = {
            guard let apple, let a = c.apple else { return nil }
            return Revalidator(apple: apple, store: store, keys: secrets.sessionKeys,
                        times: RevalidationTimes(after: Authenticator.milliseconds(a.revalidateAfter), grace: Authenticator.milliseconds(a.revalidateGrace),
                                                 outageGrace: Authenticator.milliseconds(a.outageGrace)),
                        appleTimeout: Authenticator.milliseconds(a.timeout), now: now, logger: logger, metrics: metrics,
                        fleet: fleet, revocations: revocations)
        }()
        let linkLookup: LinkLookup? = {
            guard let url = c.identity.linkLookupURL, let secret = secrets.linksSecret, let http else { return nil }
            return LinkLookup(url: url, secret: secret, http: http, logger: logger)
        }()
        let core = AuthCore(secrets: secrets, store: store, cache: cache, apple: apple, revalidator: revalidator, revocations: revocations,
                            tunnels: tunnels, outbox: outbox, events: events, linkLookup: linkLookup,
                            exchanges: NIOLockedValueBox(RateWindows()), anonymousWrites: NIOLockedValueBox(AnonymousWrites()),
                            tracer: tracer, metrics: metrics, logger: logger, now: now)
        let replayLoop = backgroundLoop
        held.setApply { await core.replay($0, on: replayLoop) }
        let subscriber = signals.map { FleetSubscriber(signals: $0, revocations: revocations, revalidator: revalidator) }
        return Parts(core: core, subscriber: subscriber, resources: CoreResources(outbox: outbox, backend: backend, http: http, held: held), tracer: tracer)
    }
}
