import AppleID
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

/// A session as the hot path keeps it in the local cache: the stored session plus the identity
/// headers already built (no formatting per request).
struct CachedSession {
    var stored: StoredSession
    var headers: [(String, String)]
    /// The configuration generation whose header names built `headers` (a reload that renames
    /// a header makes every cached set stale).
    var generation: Int
    /// The last assertion signed, per route name (when assertions are enabled).
    var assertion: (route: String, token: String, expires: Int64)? = nil
}

/// What a request's credential turned out to be.
enum Resolution {
    /// No cookie, no bearer token.
    case anonymous
    /// A credential that names no live session: forged, unknown, expired, revoked, ambiguous.
    case invalid
    case session(SessionHandle, CachedSession)
    /// The store did not answer in time: 503, the cookie kept.
    case unavailable
    /// Apple could not confirm the session for longer than `apple.outage_grace`: 503.
    case appleUnavailable
}

/// Sign-in and admission under one configuration generation: the settings a reload may change
/// (identity header names, auth prefix, public URL, return-URL policy, session lifetimes,
/// assertion issuer and lifetime, Apple scopes) over the process's `AuthCore`. A reload makes a
/// new one and swaps it with the routes, as one value (`GatewayService.reload`).
final class Authenticator: Sendable {
    let core: AuthCore
    /// Counts reloads; cached identity headers built under another generation are rebuilt.
    let generation: Int
    let names: IdentityHeaderNames
    let cookieName: String
    /// `cookieName=`, for scanning `Cookie` headers.
    let cookieMarker: String
    /// The pre-auth cookie binding a login to one browser (`SameSite=None`).
    let loginCookieName: String
    let prefix: String
    let publicURL: String
    let returnPolicy: ReturnURLPolicy
    /// What a stored session is worth at an instant.
    let policy: SessionPolicy
    var times: SessionTimes { policy.times }
    /// Milliseconds.
    var idleTimeout: Int64 { times.idle }
    var absoluteTimeout: Int64 { times.absolute }
    let assertion: IdentityAssertionSigner?
    /// The scopes the web sign-in asks Apple for.
    let scopes: [String]
    /// Where a browser goes after signing out from a route.
    let afterLogout: PostLogoutPolicy
    /// `apple.native_nonce: required`.
    let nativeNonceRequired: Bool
    /// `apple.exchanges_per_minute` (0: none).
    let exchangesPerMinute: Int
    /// `apple.logins_per_minute` and `apple.max_pending_logins` (0: none).
    let loginsPerMinute: Int
    let maxPendingLogins: Int
    /// `identity.link_url`: where `require_link` routes send an unlinked user.
    let linkURL: String?

    /// The first generation: builds the core (reads the secrets; connects nothing yet).
    convenience init(configuration c: GatewayConfiguration, group: MultiThreadedEventLoopGroup, metrics: GatewayMetrics, logger: Logger,
                     now: @escaping @Sendable () -> Int64 = SessionClock.now) throws {
        try self.init(core: AuthCore(configuration: c, group: group, metrics: metrics, logger: logger, now: now), configuration: c, generation: 0)
    }

    /// A generation over an existing core: `c` may differ from the core's configuration only in
    /// keys `ReloadRules` lets a reload change.
    init(core: AuthCore, configuration c: GatewayConfiguration, generation: Int) throws {
        self.core = core
        self.generation = generation
        let publicURL = c.server.publicURL ?? "http://\(c.server.listen)"
        if let pem = core.assertionKeyPEM {
            assertion = try IdentityAssertionSigner(pem: pem, issuer: publicURL, ttl: Int64(c.identity.assertion.ttl.components.seconds))
        } else {
            assertion = nil
        }
        names = c.identity.headers
        cookieName = c.session.cookieName
        cookieMarker = c.session.cookieName + "="
        loginCookieName = c.session.cookieName + "-login"
        prefix = c.server.authPrefix
        self.publicURL = publicURL
        var hosts = c.server.allowedRedirectHosts
        hosts += c.routes.compactMap(\.host)
        returnPolicy = ReturnURLPolicy(origin: publicURL, allowedHosts: hosts)
        policy = SessionPolicy(times: SessionTimes(idle: Self.milliseconds(c.session.idleTimeout), absolute: Self.milliseconds(c.session.absoluteTimeout)),
                               revalidation: core.revalidator?.times)
        scopes = c.apple?.scopes ?? []
        afterLogout = PostLogoutPolicy(c.routes, signIn: c.server.authPrefix + "/sign-in?message=signed_out")
        nativeNonceRequired = c.apple?.nativeNonce == .required
        exchangesPerMinute = c.apple?.exchangesPerMinute ?? 0
        loginsPerMinute = c.apple?.loginsPerMinute ?? 0
        maxPendingLogins = c.apple?.maxPendingLogins ?? 0
        linkURL = c.identity.linkURL
    }

    /// Apple's `redirect_uri` for the web flow: where Apple posts back, registered with the
    /// Services ID; the same string at `/login` and at the code exchange.
    var callbackURL: String { publicURL + prefix + "/callback" }

    /// The sign-in page, returning to `rd` (already validated) afterwards.
    func signInPath(rd: String, message: String? = nil) -> String {
        prefix + "/sign-in?" + (message.map { "message=" + $0 + "&" } ?? "") + "rd=" + FormBody.escape(rd)
    }

    /// The store as the endpoints use it: async, each call bounded by `store.timeout`.
    func store(on loop: any EventLoop) -> BoundedStore { BoundedStore(core: core, loop: loop) }

    /// This generation becomes the running one for checks outside requests.
    func activate() {
        core.times.withLockedValue { $0 = times }
    }

    static func milliseconds(_ d: Duration) -> Int64 {
        d.components.seconds * 1000 + d.components.attoseconds / 1_000_000_000_000_000
    }

    var keys: SessionKeys { core.keys }
    var store: any SessionStore { core.store }
    var cache: LocalSessionCache<CachedSession> { core.cache }
    var apple: AppleServices? { core.apple }
    var revalidator: Revalidator? { core.revalidator }
    var tunnels: TunnelRegistry { core.tunnels }
    var metrics: GatewayMetrics { core.metrics }
    var logger: Logger { core.logger }
    var now: @Sendable () -> Int64 { core.now }

    func withDeadline<T: Sendable>(_ future: EventLoopFuture<T>, on loop: any EventLoop) -> EventLoopFuture<T> {
        core.withDeadline(future, on: loop)
    }

    // MARK: lookup

    enum Lookup {
        case now(Resolution)
        case later(EventLoopFuture<Resolution>)
    }

    /// Cookie or bearer → signature → local cache → store (bounded by `store.timeout`) →
    /// timeouts → revocation. Synchronous on a cache hit.
    func lookup(_ headers: some HeaderValues, on loop: any EventLoop) -> Lookup {
        let value: Substring
        switch credential(headers) {
        case .none: return .now(.anonymous)
        case .ambiguous: return .now(.invalid)
        case .value(let v): value = v
        }
        guard let handle = keys.handle(forCookie: value) else { return .now(.invalid) }
        let t = now()
        if let cached = cache.get(handle) {
            metrics.cacheHits.increment()
            return admit(handle, cached, now: t, on: loop)
        }
        metrics.cacheMisses.increment()
        let loaded = withDeadline(store.load(handle, on: loop), on: loop)
        return .later(loaded.flatMap { stored -> EventLoopFuture<Resolution> in
            guard let stored else { return loop.makeSucceededFuture(.invalid) }
            let cached = CachedSession(stored: stored, headers: self.identityHeaders(stored), generation: self.generation)
            if self.isLive(stored, now: t) { self.cache.put(handle, sub: stored.session.sub, cached) }
            switch self.admit(handle, cached, now: t, on: loop) {
            case .now(let resolution): return loop.makeSucceededFuture(resolution)
            case .later(let future): return future
            }
        }.recover { error in
            self.logger.warning("session store unavailable: admission answers 503", metadata: ["error": "\(error)"])
            return .unavailable
        })
    }

    /// `lookup` from anywhere (async code): runs on `loop`, answers a future.
    func resolve(_ headers: HTTPHeaders, on loop: any EventLoop) -> EventLoopFuture<Resolution> {
        loop.flatSubmit {
            switch self.lookup(headers, on: loop) {
            case .now(let resolution): return loop.makeSucceededFuture(resolution)
            case .later(let future): return future
            }
        }
    }

    /// Acts on `SessionPolicy`'s decision: drops a dead session from the cache, records activity,
    /// and asks Apple when a re-validation is due (in the background, or before answering).
    private func admit(_ handle: SessionHandle, _ cached: CachedSession, now t: Int64, on loop: any EventLoop) -> Lookup {
        let session = cached.stored.session
        let revalidation: SessionPolicy.Revalidation
        switch policy.decide(cached.stored, now: t) {
        case .dead:
            cache.invalidate(handle)
            return .now(.invalid)
        case .live(let touch, let r):
            revalidation = r
            if touch {
                cache.update(handle) { $0.stored.session.lastSeen = t }
                store.touch(handle, lastSeen: t, expiresAt: policy.expiry(afterTouching: session, at: t), on: loop).whenFailure { error in
                    self.logger.debug("could not record session activity", metadata: ["error": "\(error)"])
                }
            }
        }
        guard let revalidator else { return .now(.session(handle, cached)) }
        switch revalidation {
        case .none:
            return .now(.session(handle, cached))
        case .background:
            metrics.recordRevalidation(kind: .background)
            revalidator.validate(session, on: loop).whenSuccess { outcome in
                if case .valid(let at) = outcome { self.cache.update(handle) { $0.stored.session.validatedAt = at } }
            }
            return .now(.session(handle, cached))
        case .beforeAnswering:
            metrics.recordRevalidation(kind: .blocking)
            return .later(revalidator.validate(session, on: loop).hop(to: loop).map { outcome in
                switch outcome {
                case .valid(let at):
                    self.cache.update(handle) { $0.stored.session.validatedAt = at }
                    var fresh = cached
                    fresh.stored.session.validatedAt = at
                    return .session(handle, fresh)
                case .revoked:
                    return .invalid
                case .unknown:
                    return self.policy.keepsWithoutApple(session, now: t) ? .session(handle, cached) : .appleUnavailable
                }
            })
        }
    }

    func isLive(_ s: StoredSession, now t: Int64) -> Bool { times.isLive(s, now: t) }

    // MARK: ending sessions

    typealias RevocationSource = AuthCore.RevocationSource

    func revokeUser(_ sub: String, source: RevocationSource, at: Int64? = nil, forget: Bool = false,
                    event: (kind: AppEventKind, reason: String)? = nil, on loop: any EventLoop) -> EventLoopFuture<Int> {
        core.revokeUser(sub, source: source, at: at, forget: forget, event: event, on: loop)
    }

    func invalidateUser(_ sub: String, on loop: any EventLoop) { core.invalidateUser(sub, on: loop) }

    func endSession(_ handle: SessionHandle, sub: String, reason: GatewayMetrics.SessionEndReason, on loop: any EventLoop) -> EventLoopFuture<Void> {
        core.endSession(handle, sub: sub, reason: reason, on: loop)
    }

    // MARK: sessions

    /// A new session for a verified Apple identity: a fresh id (never one the client sent), the
    /// refresh token sealed, the profile merged. Answers the cookie value and the expiry (ms).
    func createSession(identity: AppleIdentity, refreshToken: String?, name: String?, on loop: any EventLoop) -> EventLoopFuture<(cookie: String, expiresAt: Int64, user: UserProfile)> {
        metrics.recordRevalidation(kind: .fresh)
        let (cookie, handle) = keys.newSession()
        let t = now()
        let record = SessionRecord(handle: handle, sub: identity.subject, clientID: identity.audience, created: t, lastSeen: t, validatedAt: t,
                                   sealedRefreshToken: refreshToken.map { keys.seal($0, for: handle) })
        let profile = UserProfile(sub: identity.subject, name: name, email: identity.email, emailVerified: identity.emailVerified,
                                  privateEmail: identity.isPrivateEmail, realUserStatus: identity.realUserStatus)
        // The session ends after idle_timeout without activity, and at expires_at at the latest.
        let expiresAt = t + absoluteTimeout
        return withDeadline(store.create(record, profile: profile, expiresAt: t + idleTimeout, on: loop), on: loop).flatMap { () -> EventLoopFuture<Void> in
            // Kept beyond the session, so that a deletion can revoke it at Apple.
            guard let refreshToken else { return loop.makeSucceededVoidFuture() }
            let sealed = self.keys.seal(refreshToken, context: SessionKeys.userContext(identity.subject))
            return self.withDeadline(self.store.saveRefreshToken(sealed, clientID: identity.audience, of: identity.subject, on: loop), on: loop)
        }.flatMap {
            self.withDeadline(self.store.profile(of: identity.subject, on: loop), on: loop)
        }.map { stored in
            (cookie, expiresAt, stored ?? profile)
        }
    }

    /// `Set-Cookie` for a session: `__Host-` rules (Secure, Path=/, no Domain), HttpOnly, Lax.
    func sessionCookie(_ value: String) -> (String, String) {
        ("set-cookie", "\(cookieName)=\(value); Path=/; Secure; HttpOnly; SameSite=Lax; Max-Age=\(absoluteTimeout / 1000)")
    }

    func clearCookie(_ name: String, sameSiteNone: Bool = false) -> (String, String) {
        ("set-cookie", "\(name)=; Path=/; Secure; HttpOnly; SameSite=\(sameSiteNone ? "None" : "Lax"); Max-Age=0")
    }
}
