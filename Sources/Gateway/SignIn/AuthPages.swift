import Foundation
import GatewayConfig
import HTTPProxy
import NIOCore
import NIOHTTP1

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

    static func html(_ status: HTTPResponseStatus, _ page: String, headers: [(String, String)] = []) -> LocalResponse {
        LocalResponse(status: status, headers: [
            ("content-type", "text/html; charset=utf-8"), ("cache-control", "no-store"),
            ("content-security-policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; frame-ancestors 'none'"),
            ("x-content-type-options", "nosniff"), ("referrer-policy", "no-referrer"),
        ] + headers, body: ByteBuffer(string: page))
    }

    static func redirect(_ status: HTTPResponseStatus, to location: String, headers: [(String, String)] = []) -> LocalResponse {
        LocalResponse(status: status, headers: [("location", location), ("cache-control", "no-store")] + headers)
    }

    /// Browsers (an HTML GET) go to the sign-in page and come back here; others get 401 JSON.
    static func unauthenticated(_ request: GuardRequest, action: GatewayConfiguration.UnauthenticatedAction, prefix: String) -> LocalResponse {
        if action == .redirect, request.method == .GET || request.method == .HEAD, wantsHTML(request) {
            return redirect(.found, to: "\(prefix)/sign-in?rd=\(FormBody.escape(request.target.forwarded))")
        }
        return unauthenticatedJSON
    }

    /// Made once: the 401 is the answer to every forged or missing credential on an API route.
    static let unauthenticatedJSON = json(.unauthorized, ["error": "unauthenticated", "message": "sign in first"],
                                                             headers: [("www-authenticate", #"Bearer realm="sessiongate""#)])

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

/// The HTML the gateway serves: the sign-in page (Apple's Human Interface Guidelines for the
/// button), failure pages, and the sign-out confirmation. Self-contained: no script, no
/// external resource (the CSP forbids both).
enum AuthPages {
    /// Apple's logo as a single path (drawn for this project), in a 20×24 box.
    static let appleLogo = #"<svg class="logo" viewBox="0 0 20 24" aria-hidden="true" focusable="false"><path fill="currentColor" d="M13.6 .5c.1 1.3-.4 2.6-1.2 3.5-.8.9-2 1.6-3.2 1.5-.1-1.2.5-2.5 1.2-3.3.8-.9 2.1-1.6 3.2-1.7zM19.3 17.6c-.5 1.2-.8 1.7-1.4 2.8-.9 1.5-2.2 3.3-3.8 3.3-1.4 0-1.8-.9-3.7-.9-1.9 0-2.4.9-3.8.9-1.6 0-2.8-1.6-3.7-3.1C.3 16.4 0 11.6 1.6 9c1.1-1.8 2.9-2.9 4.6-2.9 1.7 0 2.8.9 4.2.9 1.4 0 2.2-.9 4.2-.9 1.5 0 3.1.8 4.2 2.2-3.7 2-3.1 7.3.5 8.3z"/></svg>"#

    static let style = """
        :root{color-scheme:light dark;--bg:#f5f5f7;--card:#fff;--text:#1d1d1f;--muted:#6e6e73;--btn-bg:#000;--btn-fg:#fff;--btn-border:#000}
        @media (prefers-color-scheme:dark){:root{--bg:#000;--card:#1c1c1e;--text:#f5f5f7;--muted:#a1a1a6;--btn-bg:#fff;--btn-fg:#000;--btn-border:#fff}}
        *{box-sizing:border-box}
        body{margin:0;min-height:100vh;display:flex;align-items:center;justify-content:center;background:var(--bg);color:var(--text);
          font:17px/1.47 -apple-system,BlinkMacSystemFont,"SF Pro Text","Helvetica Neue",Helvetica,Arial,sans-serif}
        main{background:var(--card);width:100%;max-width:380px;margin:24px;padding:40px 32px 32px;border-radius:18px;box-shadow:0 4px 24px rgba(0,0,0,.08);text-align:center}
        h1{font-size:28px;line-height:1.14;font-weight:600;margin:0 0 8px;letter-spacing:.007em}
        p{margin:0 0 24px;color:var(--muted)}
        .notice{margin:0 0 20px;padding:10px 14px;border-radius:10px;background:rgba(255,149,0,.14);color:var(--text);font-size:15px;text-align:left}
        .siwa{display:flex;align-items:center;justify-content:center;gap:6px;width:100%;min-width:140px;height:44px;padding:0 16px;border-radius:8px;
          background:var(--btn-bg);color:var(--btn-fg);border:1px solid var(--btn-border);text-decoration:none;
          font:500 19px/1 -apple-system,BlinkMacSystemFont,"SF Pro Text","Helvetica Neue",Helvetica,Arial,sans-serif;letter-spacing:-.01em;cursor:pointer}
        .siwa .logo{width:15px;height:18px;margin-top:-3px;flex:none}
        .siwa:focus-visible{outline:3px solid #0071e3;outline-offset:3px}
        .siwa.white{--btn-bg:#fff;--btn-fg:#000;--btn-border:#fff}
        .siwa.outline{--btn-bg:#fff;--btn-fg:#000;--btn-border:#000}
        .secondary{display:inline-block;margin-top:16px;color:#0071e3;background:none;border:0;font:inherit;cursor:pointer;text-decoration:none}
        .fine{margin:24px 0 0;font-size:12px;color:var(--muted)}
        """

    static func document(title: String, _ body: String) -> String {
        """
        <!doctype html>
        <html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
        <meta name="robots" content="noindex"><title>\(escape(title))</title><style>\(style)</style></head>
        <body><main>
        \(body)
        </main></body></html>
        """
    }

    /// Messages the sign-in page can show (`?message=`): fixed texts, never echoed input.
    static let messages: [String: String] = [
        "cancelled": "Sign in was cancelled. You can try again whenever you are ready.",
        "signed_out": "You have been signed out.",
        "disconnected": "This site no longer uses your Apple Account, and every session has ended.",
        "expired": "Your sign-in took too long or was already used. Please start again.",
    ]

    static func signIn(loginURL: String, message: String?) -> String {
        let notice = message.flatMap { messages[$0] }.map { #"<p class="notice" role="status">\#(escape($0))</p>"# } ?? ""
        return document(title: "Sign in", """
            <h1>Sign in</h1>
            <p>Continue with your Apple Account to reach this site.</p>
            \(notice)
            <a class="siwa" href="\(escape(loginURL))" role="button" aria-label="Sign in with Apple">\(appleLogo)<span>Sign in with Apple</span></a>
            <p class="fine">Apple shares only your name and an email address — which can be a private relay address — with this site.</p>
            """)
    }

    static func message(title: String, detail: String, action: (label: String, url: String)?) -> String {
        let link = action.map { #"<a class="siwa outline" href="\#(escape($0.url))">\#(escape($0.label))</a>"# } ?? ""
        return document(title: title, """
            <h1>\(escape(title))</h1>
            <p>\(escape(detail))</p>
            \(link)
            """)
    }

    static func confirmSignOut(action: String, stay: String = "/") -> String {
        document(title: "Sign out", """
            <h1>Sign out?</h1>
            <p>You will need to sign in with Apple again to come back.</p>
            <form method="post" action="\(escape(action))"><button class="siwa" type="submit">Sign out</button></form>
            <a class="secondary" href="\(escape(stay))">Stay signed in</a>
            """)
    }

    static func escape(_ text: String) -> String {
        var out = ""
        out.reserveCapacity(text.utf8.count)
        for c in text.unicodeScalars {
            switch c {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            default: out.unicodeScalars.append(c)
            }
        }
        return out
    }
}
