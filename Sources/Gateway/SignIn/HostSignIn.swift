import AppleID
import GatewayConfig
import HTTPProxy
import NIOCore
import NIOHTTP1
import Sessions

/// Sign-in on every routed host (issue 39 §1). Apple posts back to one registered return URL,
/// `public_url` + `/callback`, so a sign-in that starts on another routed host goes through
/// `public_url`'s host and comes back:
///
/// - a host under `session.cookie_domain` shares the session cookie (`Domain=`): its login is a
///   redirect to `public_url`'s login with `rd` naming the page on that host;
/// - any other routed host (an unrelated domain) gets the session by a one-time ticket
///   (`SignInTicket`): its login sets a ticket cookie on that host and sends the cookie's hash
///   along; the callback hands the new session to that host as a sealed ticket in the redirect's
///   URL, which `/redeem` on that host turns into the host's own session cookie, once, within a
///   minute, and only in the browser that holds the ticket cookie.
///
/// Every host holds the same session, so a logout anywhere ends it everywhere.
extension AuthEndpointGuard {
    /// The login of a sign-in that starts on a routed host other than `public_url`'s: a
    /// redirect to `public_url`'s login, returning to `returnTo` on `host`; nil when the host is
    /// `public_url`'s own (or not one of the routes', which keeps the single-host behaviour).
    func loginElsewhere(host: RequestHost?, returnTo: String) -> LocalResponse? {
        guard let host, let url = auth.absoluteOn(host, returnTo) else { return nil }
        let start = auth.publicURL + auth.prefix + "/login?rd=" + FormBody.escape(url)
        // A return URL elsewhere (an allowed host) signs in on public_url's host only, as there.
        if auth.sharesCookie(host.name) || auth.ticketHost(of: url) != host.name { return AuthResponses.redirect(.found, to: start) }
        let binding = Self.randomToken()
        return AuthResponses.redirect(.found, to: start + "&bind=" + sha256Hex(binding), headers: [
            ("set-cookie", "\(auth.ticketCookieName)=\(binding); Path=/; Secure; HttpOnly; SameSite=Lax; Max-Age=\(AnonymousWrites.lifetime / 1000)"),
        ])
    }

    /// The ticket binding `/login` keeps with the login state: `bind` when `returnTo` is on a
    /// routed host that needs a ticket, and a SHA-256 in hex.
    func ticketBinding(_ bind: String?, returnTo: String) -> String? {
        guard let bind, bind.utf8.count == 64, bind.utf8.allSatisfy({ (48...57).contains($0) || (97...102).contains($0) }),
              let host = auth.ticketHost(of: returnTo) else { return nil }
        return auth.sharesCookie(host) ? nil : bind
    }

    /// Where the callback sends a browser whose login carries a ticket binding: `/redeem` on the
    /// host it started on, with the session sealed for that host; nil for a login without one.
    func ticketRedirect(_ login: LoginState, cookie: String) -> String? {
        guard let binding = login.ticketBinding, let host = auth.ticketHost(of: login.returnTo),
              let origin = auth.origin(of: login.returnTo) else { return nil }
        let ticket = SignInTicket(id: Self.randomToken(), binding: binding, cookie: cookie, returnTo: login.returnTo)
        return origin + auth.prefix + "/redeem?ticket=" + ticket.seal(host: host, nowMilliseconds: core.now(), keys: core.keys)
    }

    /// `GET /redeem?ticket=`: the session a callback sealed for this host, set as this host's own
    /// cookie, then 303 to the page the sign-in started from. Refused (400, nothing set) when the
    /// ticket is not this gateway's, was sealed for another host, is over a minute old, was
    /// already presented, or this browser does not hold the ticket cookie it was bound to.
    func redeem(_ sealed: String?, host: RequestHost?, head: HTTPRequestHead, on loop: any EventLoop) async -> LocalResponse {
        let clear = auth.clearCookie(auth.ticketCookieName)
        func refused(_ detail: String, returnTo: String = "/") -> LocalResponse {
            core.metrics.recordSignIn(flow: .web, outcome: .rejected)
            return AuthResponses.html(.badRequest, AuthPages.message(title: "Sign in failed", detail: detail, action: ("Start again", auth.signInPath(rd: returnTo))),
                                      headers: [clear])
        }
        guard let host, let sealed, let ticket = SignInTicket.open(sealed, host: host.name, nowMilliseconds: core.now(), keys: core.keys) else {
            return refused("This sign-in link is not valid here, or it expired. Please sign in again.")
        }
        let path = auth.path(of: ticket.returnTo)
        // Used up by its first presentation, whoever presents it: the browser the callback sends
        // here comes first, so a link that leaks afterwards (a proxy's log, a synced history) is
        // spent even when its binding was an attacker's (`bind` is a query parameter of /login).
        do {
            guard try await core.store.claim(.ticket(id: ticket.id), ttl: SignInTicket.lifetime * 2, on: loop).get() else {
                return refused("This sign-in link was already used. Please sign in again.", returnTo: path)
            }
        } catch {
            return AuthResponses.html(.serviceUnavailable, AuthPages.message(
                title: "Sign in is unavailable", detail: "The gateway could not finish your sign-in just now. Please try again in a moment.",
                action: ("Try again", auth.signInPath(rd: path))))
        }
        guard let cookie = Authenticator.cookie(auth.ticketCookieName, in: head.headers),
              IdentityTokenVerifier.constantTimeEqual(ticket.binding, sha256Hex(cookie)) else {
            return refused("This sign-in was started in another browser, or its cookies are blocked. Please sign in again.", returnTo: path)
        }
        // A session this browser held on this host before is replaced, as at the callback.
        if let previous = presentedSession(head), previous != core.keys.handle(forCookie: Substring(ticket.cookie)) {
            await endReplaced(previous, on: loop)
        }
        return AuthResponses.redirect(.seeOther, to: path, headers: [auth.sessionCookie(ticket.cookie, hostOnly: true), clear, ("referrer-policy", "no-referrer")])
    }
}

/// The session a callback hands to a routed host outside the session cookie's domain: sealed
/// (AES-GCM under the session secret) for that host name, so it opens nowhere else and reads as
/// nothing in a URL; it lasts `lifetime`, redeems once (a store claim on `id`), and only in the
/// browser holding the ticket cookie whose SHA-256 is `binding`. The query string that carries it
/// is never logged, and `/redeem` answers with `Referrer-Policy: no-referrer`.
struct SignInTicket: Equatable {
    /// Milliseconds from the callback to the redeem: one redirect.
    static let lifetime: Int64 = 60_000

    var id: String
    var binding: String
    /// The session cookie's value.
    var cookie: String
    /// The validated absolute URL on the ticket's host the sign-in started from.
    var returnTo: String

    static func context(_ host: String) -> String { "sign-in ticket " + host }

    func seal(host: String, nowMilliseconds: Int64, keys: SessionKeys) -> String {
        keys.seal("\(nowMilliseconds + Self.lifetime) \(id) \(binding) \(cookie) \(returnTo)", context: Self.context(host))
    }

    /// The ticket sealed for `host`, if this gateway sealed it and it has not expired.
    static func open(_ sealed: String, host: String, nowMilliseconds: Int64, keys: SessionKeys) -> SignInTicket? {
        guard sealed.utf8.count <= 8192, let plain = keys.open(sealed, context: context(host)) else { return nil }
        let parts = plain.split(separator: " ", maxSplits: 4, omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 5, let expires = Int64(parts[0]), nowMilliseconds < expires else { return nil }
        return SignInTicket(id: parts[1], binding: parts[2], cookie: parts[3], returnTo: parts[4])
    }
}

extension Authenticator {
    /// The cookie binding a ticket to the browser on the host a sign-in started from.
    var ticketCookieName: String { cookieName + "-ticket" }

    /// A host under `session.cookie_domain` (the domain itself or a subdomain): it holds the
    /// session cookie `public_url`'s host sets.
    func sharesCookie(_ host: String) -> Bool {
        guard let cookieDomain else { return false }
        return host == cookieDomain || host.hasSuffix("." + cookieDomain)
    }

    /// `returnTo` (a validated path) as an absolute URL on `host` (a validated absolute URL as it
    /// is), when `host` is a routed host other than `public_url`'s; nil otherwise.
    func absoluteOn(_ host: RequestHost, _ returnTo: String) -> String? {
        guard host.name != publicHost, routeHosts.contains(host.name) else { return nil }
        guard returnTo.hasPrefix("/") else { return returnTo }  // validated: an absolute URL stays as it is
        let scheme = publicURL.hasPrefix("https://") ? "https://" : "http://"
        return returnPolicy.validate(scheme + host.authority + returnTo)
    }

    /// The routed host (not `public_url`'s) an absolute return URL names.
    func ticketHost(of returnTo: String) -> String? {
        guard let origin = origin(of: returnTo) else { return nil }
        let host = GatewayConfiguration.hostName(ofOrigin: origin)
        return host != publicHost && routeHosts.contains(host) ? host : nil
    }

    /// `scheme://authority` of an absolute URL.
    func origin(of url: String) -> String? {
        guard let schemeEnd = url.range(of: "://") else { return nil }
        let authority = url[schemeEnd.upperBound...].prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        return authority.isEmpty ? nil : String(url[..<schemeEnd.upperBound]) + authority
    }

    /// The path (with query) of an absolute URL, or the value itself when it is a path.
    func path(of url: String) -> String {
        guard let origin = origin(of: url) else { return url }
        let rest = String(url.dropFirst(origin.count))
        return rest.isEmpty ? "/" : rest
    }
}
