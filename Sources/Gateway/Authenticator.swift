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

    // MARK: credentials

    enum Credential {
        case none
        /// The cookie or the bearer token sent twice, a cookie and a bearer token naming
        /// different sessions: treated as unauthenticated (security.md), whichever is valid.
        case ambiguous
        case value(Substring)
    }

    /// `Authorization: Bearer` or the session cookie; both only if they carry the same token (a
    /// native app may send its cookie jar too). The token is a slice of its field's value; the
    /// `Authorization` fields are not even looked at when the proxy saw no bearer.
    func credential(_ headers: some HeaderValues) -> Credential {
        var bearer: Substring? = nil
        var cookie: Substring? = nil
        var doubled = false
        if headers.mayCarryBearer {
            headers.forEachValue(named: "authorization") { value in
                if let token = Self.bearerToken(value) {
                    if bearer != nil { doubled = true }
                    bearer = token
                }
            }
        }
        headers.forEachValue(named: "cookie") { value in
            Self.forEachCookie(named: cookieMarker, in: value) { v in
                if cookie != nil { doubled = true }
                cookie = v
            }
        }
        if doubled { return .ambiguous }
        switch (bearer, cookie) {
        case (nil, nil): return .none
        case (let b?, nil): return .value(b)
        case (nil, let c?): return .value(c)
        case (let b?, let c?): return b == c ? .value(b) : .ambiguous
        }
    }

    /// Whether `Authorization: Bearer` carries one of our session tokens (signature valid): then it
    /// is the gateway's credential and never reaches the app.
    /// Every `Authorization` header is looked at: a junk bearer first must not hide ours.
    func carriesSessionBearer(_ headers: some HeaderValues) -> Bool {
        var carries = false
        headers.forEachValue(named: "authorization") { value in
            if !carries, let token = Self.bearerToken(value), keys.handle(forCookie: token) != nil { carries = true }
        }
        return carries
    }

    /// The token of an `Authorization: Bearer <token>` value (scheme without case).
    static func bearerToken(_ value: String) -> Substring? {
        let v = value.drop { $0 == " " }
        guard v.utf8.count > 7, HeaderName.equals(v.prefix(7), "bearer ") else { return nil }
        return v.dropFirst(7).drop { $0 == " " }
    }

    /// Calls `body` with the value of every `name=value` pair in a `Cookie` header whose name
    /// is `marker` minus its `=`. Scans bytes; the values are slices of `header`.
    static func forEachCookie(named marker: String, in header: String, _ body: (Substring) -> Void) {
        let bytes = header.utf8
        let markerBytes = marker.utf8
        var i = bytes.startIndex
        while i < bytes.endIndex {
            // Skip the separator's spaces, then compare the name.
            while i < bytes.endIndex, bytes[i] == UInt8(ascii: " ") || bytes[i] == UInt8(ascii: "\t") { i = bytes.index(after: i) }
            let pairStart = i
            var end = i
            while end < bytes.endIndex, bytes[end] != UInt8(ascii: ";") { end = bytes.index(after: end) }
            if bytes[pairStart..<end].starts(with: markerBytes) {
                let valueStart = bytes.index(pairStart, offsetBy: markerBytes.count)
                body(Substring(bytes[valueStart..<end]))
            }
            i = end < bytes.endIndex ? bytes.index(after: end) : end
        }
    }

    /// The value of the named cookie, if sent exactly once.
    static func cookie(_ name: String, in headers: HTTPHeaders) -> String? {
        var found: String? = nil
        var count = 0
        for value in headers["cookie"] {
            forEachCookie(named: name + "=", in: value) { v in
                count += 1
                found = String(v)
            }
        }
        return count == 1 ? found : nil
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
            let cached = CachedSession(stored: stored, headers: self.identityHeaders(stored.user), generation: self.generation)
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

    // MARK: identity

    /// The identity headers of DESIGN §1 for a user; values never carry CR, LF or NUL.
    func identityHeaders(_ user: UserProfile) -> [(String, String)] { Self.identityHeaders(user, names: names) }

    static func identityHeaders(_ user: UserProfile, names: IdentityHeaderNames) -> [(String, String)] {
        var h: [(String, String)] = [(names.user, user.sub)]
        if let v = user.email { h.append((names.email, v)) }
        if let v = user.emailVerified { h.append((names.emailVerified, v ? "true" : "false")) }
        if let v = user.privateEmail { h.append((names.privateEmail, v ? "true" : "false")) }
        if let v = user.emailForwarding { h.append((names.emailForwarding, v)) }
        if let v = user.name { h.append((names.name, FormBody.escape(v))) }  // UTF-8, percent-encoded
        if let v = user.realUserStatus { h.append((names.realUserStatus, String(v))) }
        return h.filter { HTTPWire.isSafeValue($0.1) }
    }

    /// The headers to forward for a session on a route (identity, plus an assertion when enabled;
    /// a fresh one is cached until half its lifetime is left).
    func forwardHeaders(_ handle: SessionHandle, _ cached: CachedSession, route: String, on loop: any EventLoop) -> [(String, String)] {
        var cached = cached
        if cached.generation != generation {
            // Cached under another configuration: its header names (and assertion issuer) may
            // have changed. Rebuilt once, then cached for this generation.
            cached.headers = identityHeaders(cached.stored.user)
            cached.generation = generation
            cached.assertion = nil
            let (headers, generation) = (cached.headers, generation)
            cache.update(handle) {
                // A request of an older generation finishing late must not undo a newer rebuild.
                guard $0.generation < generation else { return }
                $0.headers = headers
                $0.generation = generation
                $0.assertion = nil
            }
        }
        guard let assertion else { return cached.headers }
        let t = now() / 1000
        if let a = cached.assertion, a.route == route, a.expires - t > assertion.ttl / 2 {
            return cached.headers + [(names.assertion, a.token)]
        }
        let user = cached.stored.user
        let token = assertion.sign(UserProfileClaims(sub: user.sub, email: user.email, emailVerified: user.emailVerified, name: user.name), audience: route, now: t)
        let generation = self.generation
        cache.update(handle) {
            guard $0.generation == generation else { return }
            $0.assertion = (route, token, t + assertion.ttl)
        }
        return cached.headers + [(names.assertion, token)]
    }

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
