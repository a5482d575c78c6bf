import Foundation
import GatewayConfig
import HTTPProxy
import NIOCore
import NIOHTTP1
import Sessions

/// The responses the gateway writes itself for sign-in and admission: pages for browsers, JSON
/// for everything else. No page ever includes a token, a cookie value or a session id.
enum AuthResponses {
    /// A browser navigating (an HTML page is acceptable), not a script: `X-Requested-With`
    /// (jQuery, Angular, many apps' XHR) marks an API call whatever its `Accept`.
    static func wantsHTML(_ head: HTTPRequestHead) -> Bool { wantsHTML(head.headers) }

    static func wantsHTML(_ headers: some HeaderValues) -> Bool {
        var accept: [String] = []
        var requestedWith = false
        headers.forEachValue(named: "accept") { accept.append($0) }
        headers.forEachValue(named: "x-requested-with") { _ in requestedWith = true }
        return wantsHTML(accept: accept, requestedWith: requestedWith)
    }

    static func wantsHTML(accept: [String], requestedWith: Bool) -> Bool {
        !requestedWith && accept.contains { $0.contains("text/html") }
    }

    static func json(_ status: HTTPResponseStatus, _ object: [String: Any], headers: [(String, String)] = []) -> LocalResponse {
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data("{}".utf8)
        return LocalResponse(status: status, headers: [("content-type", "application/json"), ("cache-control", "no-store")] + headers,
                             body: ByteBuffer(bytes: data))
    }

    /// - Parameter referrerPolicy: `no-referrer`, except for a page whose form posts to the
    ///   gateway (`same-origin`): under `no-referrer` a browser sends that POST with `Origin: null`,
    ///   which the origin check refuses.
    static func html(_ status: HTTPResponseStatus, _ page: String, headers: [(String, String)] = [], referrerPolicy: String = "no-referrer") -> LocalResponse {
        LocalResponse(status: status, headers: [
            ("content-type", "text/html; charset=utf-8"), ("cache-control", "no-store"),
            ("content-security-policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; frame-ancestors 'none'"),
            ("x-content-type-options", "nosniff"), ("referrer-policy", referrerPolicy),
        ] + headers, body: ByteBuffer(string: page))
    }

    static func redirect(_ status: HTTPResponseStatus, to location: String, headers: [(String, String)] = []) -> LocalResponse {
        LocalResponse(status: status, headers: [("location", location), ("cache-control", "no-store")] + headers)
    }

    /// Browsers (an HTML GET) go to the sign-in page and come back here; others get 401 JSON.
    /// `ended`: why the session the request presented ended (`unauthenticatedJSON(ended:)`).
    static func unauthenticated(_ request: GuardRequest, action: GatewayConfiguration.UnauthenticatedAction, prefix: String, ended: SessionEnd? = nil) -> LocalResponse {
        if action == .redirect, request.method == .GET || request.method == .HEAD, wantsHTML(request) {
            return redirect(.found, to: "\(prefix)/sign-in?rd=\(FormBody.escape(request.target.forwarded))")
        }
        return unauthenticatedJSON(ended: ended)
    }

    /// The header naming why a presented session ended (`SessionEnd`), for apps to act on.
    static let sessionEndedHeader = "x-sessiongate-session-ended"

    /// The 401 of an API route: for no credential (or a forged one) `unauthenticated`; for a
    /// session that ended, also why — `reason` in the JSON, `X-Sessiongate-Session-Ended`, and
    /// RFC 6750's `error="invalid_token"` in `WWW-Authenticate`. Made once each.
    static func unauthenticatedJSON(ended: SessionEnd?) -> LocalResponse {
        ended.flatMap { endedJSON[$0] } ?? unauthenticatedJSON
    }

    static let unauthenticatedJSON = json(.unauthorized, ["error": "unauthenticated", "message": "sign in first"],
                                                             headers: [("www-authenticate", #"Bearer realm="sessiongate""#)])

    private static let endedJSON: [SessionEnd: LocalResponse] = Dictionary(uniqueKeysWithValues: SessionEnd.allCases.map { end in
        (end, json(.unauthorized, ["error": "unauthenticated", "reason": end.rawValue, "message": end.message],
                   headers: [("www-authenticate", #"Bearer realm="sessiongate", error="invalid_token", error_description="\#(end.rawValue)""#),
                             (sessionEndedHeader, end.rawValue)]))
    })

    static func forbidden(_ head: HTTPRequestHead, signOutURL: String) -> LocalResponse {
        if wantsHTML(head) {
            return html(.forbidden, AuthPages.message(title: "Access denied", detail: "You are signed in, but this account is not allowed here.",
                                                      action: ("Sign in with another account", signOutURL)))
        }
        return json(.forbidden, ["error": "forbidden", "message": "this account is not allowed on this route"])
    }

    /// Apple has not confirmed the session for longer than `apple.outage_grace`.
    /// A session Apple could not confirm within `outage_grace`: it will not come back (Apple is
    /// no longer asked about it); signing in again makes a new one.
    static func appleUnavailable(_ head: HTTPRequestHead, prefix: String) -> LocalResponse {
        if wantsHTML(head) {
            return html(.serviceUnavailable, AuthPages.message(title: "Cannot confirm your sign-in",
                                                               detail: "Your Apple Account could not be confirmed for too long. Please sign in again.",
                                                               action: ("Sign in again", prefix + "/sign-in?rd=" + FormBody.escape(head.uri))))
        }
        return json(.serviceUnavailable, ["error": "apple_unavailable",
                                          "message": "the session could not be re-validated with Apple within apple.outage_grace: sign in again"])
    }

    /// A `require_link` route and a user linked to no account: browsers go to the app's
    /// `link_url` with `rd` (where to come back to); scripts get 403 naming it.
    /// `rd` is the canonical target (as forwarded), never the raw one: `//evil.example/x` is
    /// routed as `/evil.example/x` and comes back as such.
    static func linkRequired(_ request: GuardRequest, linkURL: String) -> LocalResponse {
        if request.method == .GET || request.method == .HEAD, wantsHTML(request) {
            let target = linkURL + (linkURL.contains("?") ? "&" : "?") + "rd=" + FormBody.escape(request.target.forwarded)
            return redirect(.found, to: target)
        }
        return json(.forbidden, ["error": "link_required", "message": "this route needs an account of the app linked to your Apple ID", "link_url": linkURL])
    }

    static func storeUnavailable(_ head: HTTPRequestHead) -> LocalResponse {
        let retry = [("retry-after", "1")]
        if wantsHTML(head) {
            return html(.serviceUnavailable, AuthPages.message(title: "Temporarily unavailable",
                                                               detail: "Your session could not be checked just now. You are still signed in; please try again in a moment.",
                                                               action: nil), headers: retry)
        }
        return json(.serviceUnavailable, ["error": "store_unavailable", "message": "the session store did not answer; retry"], headers: retry)
    }
}

extension SessionEnd {
    /// What the 401 says of it.
    var message: String {
        switch self {
        case .signedOut: "this session was signed out: sign in again"
        case .revoked: "the user's Sign in with Apple consent ended (or an operator revoked it): sign in again"
        case .deleted: "the account was deleted: signing in again makes a new one"
        case .transferred: "the app moved to another team: sign in again for the new identity"
        case .expired: "the session expired: sign in again"
        }
    }
}
