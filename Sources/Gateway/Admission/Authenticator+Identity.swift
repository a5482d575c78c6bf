import GatewayConfig
import HTTPProxy
import NIOCore
import NIOHTTP1
import Sessions

/// What the app is told about the user on each forwarded request: the identity headers of
/// DESIGN §1 and, when enabled, the signed assertion.
extension Authenticator {
    /// The identity headers of DESIGN §1 for a user (and linked account); values never carry
    /// CR, LF or NUL. Built per request rather than kept with the cached session: one
    /// allocation here against about 200 bytes per cached session (issue 27), and the former
    /// `sub` ends exactly with its transfer period.
    /// - Parameters:
    ///   - now: Unix ms; the former `sub` of a transferred user is sent during the transfer
    ///     period after their mapping only (`UserProfile.formerSub(at:)`).
    ///   - room: headers the caller will append (the assertion).
    static func identityHeaders(_ user: UserProfile, account: String? = nil, names: IdentityHeaderNames, now: Int64, room: Int = 0) -> [(String, String)] {
        var h: [(String, String)] = []
        h.reserveCapacity(9 + room)
        add(&h, names.user, user.sub)
        if let v = user.email { add(&h, names.email, v) }
        if let v = user.emailVerified { add(&h, names.emailVerified, v ? "true" : "false") }
        if let v = user.privateEmail { add(&h, names.privateEmail, v ? "true" : "false") }
        if let v = user.emailForwarding { add(&h, names.emailForwarding, v) }
        if let v = user.name { add(&h, names.name, FormBody.escape(v)) }  // UTF-8, percent-encoded
        if let v = user.realUserStatus { add(&h, names.realUserStatus, String(v)) }
        if let account { add(&h, names.account, account) }
        if let v = user.formerSub(at: now) { add(&h, names.formerUser, v) }
        return h
    }

    private static func add(_ h: inout [(String, String)], _ name: String, _ value: String) {
        if HTTPWire.isSafeValue(value) { h.append((name, value)) }
    }

    /// The headers to forward for a session on a route (identity, plus an assertion when enabled;
    /// a fresh one is cached until half its lifetime is left).
    func forwardHeaders(_ handle: SessionHandle, _ cached: CachedSession, route: String, on loop: any EventLoop) -> [(String, String)] {
        let now = core.now()
        var headers = Self.identityHeaders(cached.stored.user, account: cached.stored.account, names: names, now: now, room: assertion == nil ? 0 : 1)
        guard let assertion else { return headers }
        let t = now / 1000
        // One signed under another configuration may name another issuer.
        if let a = cached.assertion, a.generation == generation, a.route == route, a.expires - t > assertion.ttl / 2 {
            headers.append((names.assertion, a.token))
            return headers
        }
        let user = cached.stored.user
        let token = assertion.sign(UserProfileClaims(sub: user.sub, email: user.email, emailVerified: user.emailVerified, name: user.name,
                                                     account: cached.stored.account, formerSub: user.formerSub(at: now)), audience: route, now: t)
        let signed = SignedAssertion(route: route, token: token, expires: t + assertion.ttl, generation: generation)
        core.cache.update(handle) {
            // A request of an older generation finishing late must not undo a newer one.
            guard ($0.assertion?.generation ?? .min) <= signed.generation else { return }
            $0.assertion = signed
        }
        headers.append((names.assertion, token))
        return headers
    }
}
