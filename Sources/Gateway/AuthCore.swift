import AppleID
import AsyncHTTPClient
import Crypto
import Foundation
import GatewayConfig
import HTTPProxy
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import Sessions

/// What sign-in and admission keep for the life of the process, whatever reloads do: session
/// keys, the store and its local cache, the Apple client, pub/sub, open tunnels. Built once at
/// start from the keys a reload may not change (`ReloadRules.restartOnly`).
final class AuthCore: Sendable {
    let keys: SessionKeys
    let store: any SessionStore
    let cache: LocalSessionCache<CachedSession>
    let apple: AppleServices?
    /// The identity-assertion key (PEM), when assertions are enabled; each configuration
    /// generation makes its signer (issuer and lifetime reload).
    let assertionKeyPEM: String?
    /// SHA-256 of the links API's bearer secret (`identity.links.secret_file`; nil: no API).
    let linksSecretDigest: SHA256Digest?
    /// `identity.link_lookup_url`: the app's answer to "whose account is this email?".
    let linkLookup: LinkLookup?
    let storeTimeout: TimeAmount
    /// What the secret files held at start, by key: a reload whose files changed in place is
    /// refused (they are read only at start), not silently ignored.
    private let secretDigests: [String: SHA256Digest]
    let now: @Sendable () -> Int64
    let metrics: GatewayMetrics
    /// Daily re-validation with Apple (when `apple:` is configured).
    let revalidator: Revalidator?
    /// Open WebSocket tunnels, ended when their session is.
    let tunnels = TunnelRegistry()
    /// Work done at least once across the fleet: revocations at Apple, events for the app.
    let outbox: Outbox
    /// `events.url`: what the app is told (nil: not configured).
    let events: AppEvents?
    /// Code exchanges per key in the current minute (`apple.exchanges_per_minute`).
    let exchanges = NIOLockedValueBox(RateWindows())
    /// Login states and native nonces written, per client and for the instance
    /// (`apple.logins_per_minute`, `apple.max_pending_logins`).
    let anonymousWrites = NIOLockedValueBox(AnonymousWrites())
    /// Session lifetimes of the running configuration, for checks outside a request.
    let times: NIOLockedValueBox<SessionTimes>
    /// Where background checks (tunnels after an invalidation) run.
    let backgroundLoop: any EventLoop
    let logger: Logger
    /// The store on Redis with the fleet's invalidation channel (nil: the memory store).
    let backend: RedisSessionBackend?
    private let httpClient: HTTPClient?

    /// Reads the secrets and connects nothing yet (Redis connects on first use).
    init(configuration c: GatewayConfiguration, group: MultiThreadedEventLoopGroup, metrics: GatewayMetrics, logger: Logger,
         now: @escaping @Sendable () -> Int64 = SessionClock.now) throws {
        let weak = NIOLockedValueBox(WeakCore())
        backgroundLoop = group.next()
        times = NIOLockedValueBox(SessionTimes(idle: Authenticator.milliseconds(c.session.idleTimeout),
                                               absolute: Authenticator.milliseconds(c.session.absoluteTimeout)))
        let secret: [UInt8]
        var digests: [String: SHA256Digest] = [:]
        if let reference = c.session.secretFile {
            secret = try reference.read(key: "session.secret_file")
            digests["session.secret_file"] = SHA256.hash(data: secret)
        } else {
            secret = SessionKeys.randomSecret()
        }
        do { keys = try SessionKeys(secret: secret) } catch { throw StartupFailure(key: "session.secret_file", "\(error)") }
        let cache = LocalSessionCache<CachedSession>(ttl: TimeAmount(c.store.localCacheTTL), capacity: c.store.localCacheEntries)
        self.cache = cache
        metrics.addCollector { [weak cache, unowned metrics] in
            guard let cache else { return }
            let (entries, evictions) = cache.statistics
            metrics.recordSessionCache(entries: entries, evictions: evictions)
        }
        for (key, reference) in Self.storeTLSFiles(c) {
            if let reference { digests[key] = SHA256.hash(data: try reference.read(key: key)) }
        }
        if let endpoint = try StoreConnection.endpoint(c.store, commandTimeout: TimeAmount(c.store.timeout)) {
            // Pub/sub: every instance drops invalidated sessions and users from its local cache.
            let listener = RedisSessionBackend.Listener(
                on: group.next(),
                onMessage: { message in
                    let core = weak.withLockedValue { $0.value }
                    if case .validated(let tokenHash) = message {
                        core?.revalidator?.resultStored(tokenHash)
                        return
                    }
                    Self.apply(message, to: cache, metrics: metrics)
                    core?.recheckTunnels(message)
                },
                onSubscribed: {
                    // Messages may have been missed while disconnected (or before the first
                    // subscription: the listener is up first): the cache forgets everything, and
                    // every open tunnel's session is checked in the store again.
                    cache.flush()
                    weak.withLockedValue { $0.value }?.recheckAllTunnels()
                })
            let backend = try StoreConnection.backend(endpoint, c.store, group: group, logger: logger, listener: listener)
            self.backend = backend
            store = MeasuredSessionStore(backend.store, metrics: metrics)
        } else {
            backend = nil
            store = MeasuredSessionStore(MemorySessionStore(now: now), metrics: metrics)
        }
        // Every secret is read before the Apple client exists: a failure here leaves nothing to close.
        var linksSecret: String? = nil
        if let reference = c.identity.linksSecretFile {
            let bytes = try reference.read(key: "identity.links.secret_file")
            let secret = bytes.reversed().drop { $0 == 0x0a || $0 == 0x0d }.reversed()  // a trailing newline from `echo`
            guard secret.count >= 32 else { throw StartupFailure(key: "identity.links.secret_file", "holds \(secret.count) bytes; at least 32 (openssl rand -hex 32)") }
            digests["identity.links.secret_file"] = SHA256.hash(data: bytes)
            linksSecretDigest = SHA256.hash(data: Array(secret))
            linksSecret = String(decoding: secret, as: UTF8.self)
        } else {
            linksSecretDigest = nil
        }
        if c.identity.assertion.enabled, let reference = c.identity.assertion.keyFile {
            let bytes = try reference.read(key: "identity.assertion.key_file")
            digests["identity.assertion.key_file"] = SHA256.hash(data: bytes)
            let pem = String(decoding: bytes, as: UTF8.self)
            guard (try? IdentityAssertionSigner(pem: pem, issuer: "", ttl: 1)) != nil else {
                throw StartupFailure(key: "identity.assertion.key_file", "not a PEM P-256 private key (openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt)")
            }
            assertionKeyPEM = pem
        } else {
            assertionKeyPEM = nil
        }
        // Apple's endpoints and the app's event receiver share one HTTP client.
        let client: HTTPClient? = c.apple != nil || c.events.isEnabled ? {
            var http = HTTPClient.Configuration(timeout: .init(connect: .seconds(5)))
            http.connectionPool = .init(idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: Revalidator.concurrentAppleCalls)
            return HTTPClient(eventLoopGroupProvider: .shared(group), configuration: http)
        }() : nil
        httpClient = client
        if let a = c.apple, let client {
            do {
                let services = try AppleServices(configuration: a, httpClient: client, logger: logger)
                digests["apple.private_key_file"] = services.keyDigest
                // Minted now, not at the first sign-in: the key is proven at start and the
                // secret's expiry is a metric from the first scrape.
                for id in services.clientIDs { _ = services.secrets.secret(for: id) }
                apple = services
            } catch {
                try? client.syncShutdown()
                throw error
            }
        } else {
            apple = nil
        }
        secretDigests = digests
        storeTimeout = TimeAmount(c.store.timeout)
        self.now = now
        self.metrics = metrics
        self.logger = logger
        if let apple, let a = c.apple {
            revalidator = Revalidator(
                apple: apple, store: store, keys: keys,
                times: RevalidationTimes(after: Authenticator.milliseconds(a.revalidateAfter), grace: Authenticator.milliseconds(a.revalidateGrace),
                                         outageGrace: Authenticator.milliseconds(a.outageGrace)),
                appleTimeout: Authenticator.milliseconds(a.timeout), now: now, logger: logger, metrics: metrics,
                onStored: { tokenHash, loop in weak.withLockedValue { $0.value }?.publish(.validated(tokenHash: tokenHash), on: loop) },
                onRevoked: { sub, at, loop in
                    guard let core = weak.withLockedValue({ $0.value }) else { return loop.makeSucceededFuture(0) }
                    return core.revokeUser(sub, source: .appleInvalidGrant, at: at, on: loop)
                })
        } else {
            revalidator = nil
        }
        // An attempt's claim outlives its slowest call (Apple's or the app's), with margin.
        let slowest = max(Authenticator.milliseconds(c.apple?.timeout ?? .seconds(5)), Authenticator.milliseconds(c.events.timeout))
        outbox = Outbox(store: store, loop: backgroundLoop, now: now, attemptTTL: slowest + 10_000,
                        metrics: metrics, logger: logger)
        if let apple {
            let keys = self.keys
            outbox.register(.appleRevoke) { job, _ in
                // Queued by the CLI or by an instance whose key this one shares; one that does
                // not open here never will.
                guard let revocation = AppleRevocation(payload: job.payload), let token = keys.open(revocation.sealedToken, context: revocation.context) else {
                    logger.warning("a queued revocation cannot be opened with this session.secret_file: dropped")
                    return .drop
                }
                let outcome = await metrics.timeAppleCall(.revoke) { await apple.tokens.revoke(token: token, isRefreshToken: true, clientID: revocation.clientID) }
                metrics.recordAppleCall(endpoint: .revoke, outcome: outcome == .revoked ? .ok : .failed)
                if outcome != .revoked {
                    logger.warning("Apple did not confirm a token revocation: retried later", metadata: ["outcome": "\(outcome)", "attempt": "\(job.attempts + 1)"])
                }
                return outcome == .revoked ? .done : .retry
            }
        }
        linkLookup = zip3(c.identity.linkLookupURL, linksSecret, client).map { LinkLookup(url: $0.0, secret: $0.1, http: $0.2, logger: logger) }
        let issuer = c.server.publicURL ?? "http://\(c.server.listen)"
        let signer = assertionKeyPEM.flatMap { try? IdentityAssertionSigner(pem: $0, issuer: issuer, ttl: 60) }
        let outbox = self.outbox
        events = client.flatMap { AppEvents(c.events, signer: signer, outbox: outbox, http: $0, now: now, logger: logger) }
        weak.withLockedValue { $0.value = self }
    }

    /// The secret files of `c` whose content differs from what was read at start (or that can
    /// no longer be read), as problems for a refused reload.
    func changedSecrets(_ c: GatewayConfiguration, locations: [String: ConfigLocation]) -> [ConfigProblem] {
        let references: [(String, SecretReference?)] = [
            ("session.secret_file", c.session.secretFile), ("apple.private_key_file", c.apple?.privateKeyFile),
            ("identity.assertion.key_file", c.identity.assertion.enabled ? c.identity.assertion.keyFile : nil),
            ("identity.links.secret_file", c.identity.linksSecretFile),
        ] + Self.storeTLSFiles(c)
        return references.compactMap { key, reference -> ConfigProblem? in
            guard let reference, let before = secretDigests[key] else { return nil }
            let message: String
            do {
                guard SHA256.hash(data: try reference.read(key: key)) != before else { return nil }
                message = "\(reference): the content changed; it is read only at start: restart to use it (the reload is refused)"
            } catch {
                message = "\((error as? StartupFailure)?.message ?? "\(error)") (the running gateway keeps what it read at start; the reload is refused)"
            }
            return StartupFailure(key: key, message).problem(locations: locations)
        }
    }

    /// Redis's TLS files: read at start only, like the other secrets (a changed file refuses
    /// the reload rather than being ignored).
    static func storeTLSFiles(_ c: GatewayConfiguration) -> [(String, SecretReference?)] {
        guard c.store.redisURL?.tls == true else { return [] }
        return [("store.tls.ca_file", c.store.tls.caFile), ("store.tls.certificate_file", c.store.tls.certificateFile),
                ("store.tls.private_key_file", c.store.tls.privateKeyFile)].map { ($0.0, $0.1.map(SecretReference.file)) }
    }

    /// Starts listening for invalidations (Redis only).
    func start() {
        backend?.listen()
        outbox.start()
    }

    /// Releases what `init` made when the process will not run (nothing was started or connected).
    func abandon() {
        try? httpClient?.syncShutdown()
    }

    func shutdown() async {
        outbox.stop()
        await outbox.drain()
        await backend?.shutdown()
        try? await httpClient?.shutdown()
    }

    /// Fails with `SessionStoreError` when `future` has not completed within `store.timeout`.
    func withDeadline<T: Sendable>(_ future: EventLoopFuture<T>, on loop: any EventLoop) -> EventLoopFuture<T> {
        let promise = loop.makePromise(of: T.self)
        let timer = loop.scheduleTask(in: storeTimeout) { promise.fail(SessionStoreError("no answer within store.timeout")) }
        future.hop(to: loop).whenComplete { result in
            timer.cancel()
            promise.completeWith(result)
        }
        return promise.futureResult
    }
}

/// All three, or nil.
private func zip3<A, B, C>(_ a: A?, _ b: B?, _ c: C?) -> (A, B, C)? {
    guard let a, let b, let c else { return nil }
    return (a, b, c)
}

/// Lets the revalidator and the subscriber reach the core without a retain cycle.
struct WeakCore {
    weak var value: AuthCore?
}
