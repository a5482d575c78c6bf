import Foundation
import NIOCore
import NIOHTTP1

/// `/auth/authorize` (apple-sign-in.md §1): the validation matrix with non-redirected 400s, a
/// consent page listing test users (or automatic consent), delivery by `query`, `fragment` or
/// `form_post`, and the `user` JSON only on a user's first authorization of a client.
extension SimulatedAppleID {
    /// A validated authorization request.
    struct Authorization {
        var clientID: String
        var redirectURI: String
        var withIDToken: Bool
        var mode: String
        var scopes: [String]
        var state: String?
        var nonce: String?

        /// The fields that carry it through the consent form.
        var formFields: [(String, String)] {
            var fields = [("client_id", clientID), ("redirect_uri", redirectURI), ("response_type", withIDToken ? "code id_token" : "code"),
                          ("response_mode", mode), ("scope", scopes.joined(separator: " "))]
            if let state { fields.append(("state", state)) }
            if let nonce { fields.append(("nonce", nonce)) }
            return fields
        }
    }

    /// GET: validate, then show the consent page (or consent at once in auto-consent mode).
    func authorizeEndpoint(_ request: SimulatorRequest) -> SimulatorResponse {
        let params: [String: String]
        switch URLEncodedForm.parse(request.query) {
        case .success(let fields): params = fields
        case .failure(let failure): return Self.error(.badRequest, "invalid_request", failure.description)
        }
        switch validateAuthorization(params) {
        case .refused(let response): return response
        case .ok(let authorization):
            if let auto = faults.withLockedValue({ $0.autoConsent }) {
                let sub = auto.isEmpty ? (grants.withLockedValue { $0.users.keys.sorted().first }) ?? createUser() : auto
                return deliver(authorization, sub: sub)
            }
            return consentPage(authorization)
        }
    }

    /// POST from the consent page: the chosen user, or Cancel.
    func consentEndpoint(_ request: SimulatorRequest) -> SimulatorResponse {
        let form: [String: String]
        switch URLEncodedForm.parse(Array(request.body.readableBytesView)) {
        case .success(let fields): form = fields
        case .failure(let failure): return Self.error(.badRequest, "invalid_request", failure.description)
        }
        switch validateAuthorization(form.filter { $0.key != "sub" && $0.key != "action" }) {
        case .refused(let response): return response
        case .ok(let authorization):
            if form["action"] == "cancel" {
                var fields = [("error", "user_cancelled_authorize")]
                if let state = authorization.state { fields.append(("state", state)) }
                return respond(authorization, fields: fields)
            }
            guard let sub = form["sub"], grants.withLockedValue({ $0.users[sub] }) != nil else { return Self.error(.badRequest, "invalid_request", "unknown user") }
            return deliver(authorization, sub: sub)
        }
    }

    /// §1.2 and §1.5, in that order of checks.
    func validateAuthorization(_ p: [String: String]) -> GrantCheck<Authorization> {
        guard let clientID = p["client_id"] else { return .refused(Self.error(.badRequest, "invalid_request", "client_id is required")) }
        guard let returnURLs = team.clients[clientID] else { return .refused(Self.error(.badRequest, "invalid_client")) }
        guard let redirectURI = p["redirect_uri"], returnURLs.contains(redirectURI), team.acceptsReturnURL(redirectURI) else {
            return .refused(Self.error(.badRequest, "unauthorized_client", "Invalid web redirect url"))
        }
        let types = Set((p["response_type"] ?? "").split(separator: " ").map(String.init))
        guard types == ["code"] || types == ["code", "id_token"] else {
            return .refused(Self.error(.badRequest, "invalid_request", "Invalid response type"))
        }
        let scopes = (p["scope"] ?? "").split(separator: " ").map(String.init)
        guard scopes.allSatisfy({ ["name", "email", "openid"].contains($0) }) else { return .refused(Self.error(.badRequest, "invalid_scope")) }
        let mode = p["response_mode"] ?? "query"
        guard ["query", "fragment", "form_post"].contains(mode) else { return .refused(Self.error(.badRequest, "invalid_request", "Invalid response mode")) }
        if scopes.contains(where: { $0 == "name" || $0 == "email" }), mode != "form_post" {
            return .refused(Self.error(.badRequest, "invalid_request", "response_mode must be form_post when name or email scope is requested"))
        }
        if types.contains("id_token"), mode == "query" { return .refused(Self.error(.badRequest, "invalid_request", "Invalid response mode")) }
        return .ok(Authorization(clientID: clientID, redirectURI: redirectURI, withIDToken: types.contains("id_token"), mode: mode,
                                 scopes: scopes, state: p["state"], nonce: p["nonce"]))
    }

    /// Issues the code (and id_token, and first-time `user`) and sends them to the client.
    func deliver(_ a: Authorization, sub: String) -> SimulatorResponse {
        // Consent is per app group: a user who authorized the app natively is not asked (and
        // the `user` JSON is not sent) again on the web.
        let firstTime: Grants.User? = grants.withLockedValue { g in
            guard let user = g.users[sub], !user.authorized else { return nil }
            g.users[sub]?.authorized = true
            g.users[sub]?.grantedScopes = Set(a.scopes)
            return user
        }
        let code = issueCode(sub: sub, clientID: a.clientID, redirectURI: a.redirectURI, nonce: a.nonce, firstAuthorization: firstTime != nil)
        var fields: [(String, String)] = []
        if let state = a.state { fields.append(("state", state)) }
        fields.append(("code", code))
        if a.withIDToken, let token = try? identityToken(sub: sub, clientID: a.clientID, nonce: a.nonce, now: clock(), faults: faults.withLockedValue { $0 },
                                                         code: code, firstAuthorization: firstTime != nil) {
            fields.append(("id_token", token))
        }
        if a.mode == "form_post", let user = firstTime, a.scopes.contains(where: { $0 == "name" || $0 == "email" }) {
            var object: [String: Any] = [:]
            if a.scopes.contains("name") { object["name"] = ["firstName": user.firstName, "lastName": user.lastName] }
            if a.scopes.contains("email") { object["email"] = user.email }
            if let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) {
                fields.append(("user", String(decoding: data, as: UTF8.self)))
            }
        }
        return respond(a, fields: fields)
    }

    /// Sends fields by the response mode: a 302 with a query or fragment, or Apple's
    /// auto-submitting form (a cross-site POST, as the real one is).
    func respond(_ a: Authorization, fields: [(String, String)]) -> SimulatorResponse {
        let encoded = URLEncodedForm.encode(fields)
        switch a.mode {
        case "query", "fragment":
            let separator = a.mode == "query" ? (a.redirectURI.contains("?") ? "&" : "?") : "#"
            var response = SimulatorResponse(status: .found, "", headers: [("location", a.redirectURI + separator + encoded)])
            response.body = ByteBuffer()
            return response
        default:
            let inputs = fields.map { #"<input type="hidden" name="\#(Self.html($0.0))" value="\#(Self.html($0.1))">"# }.joined(separator: "\n")
            let page = """
                <!doctype html><html><head><meta charset="utf-8"><title>Signing in…</title></head>
                <body onload="document.forms[0].submit()">
                <form method="post" action="\(Self.html(a.redirectURI))">
                \(inputs)
                <noscript><button type="submit">Continue</button></noscript>
                </form></body></html>
                """
            return SimulatorResponse(contentType: "text/html; charset=utf-8", page)
        }
    }

    func consentPage(_ a: Authorization) -> SimulatorResponse {
        var users = grants.withLockedValue { $0.users.values.sorted { $0.sub < $1.sub } }
        if users.isEmpty {
            createUser()
            users = grants.withLockedValue { $0.users.values.sorted { $0.sub < $1.sub } }
        }
        let hidden = a.formFields.map { #"<input type="hidden" name="\#(Self.html($0.0))" value="\#(Self.html($0.1))">"# }.joined()
        let choices = users.map { user in
            #"<button class="user" type="submit" name="sub" value="\#(Self.html(user.sub))"><b>\#(Self.html(user.firstName)) \#(Self.html(user.lastName))</b><br><small>\#(Self.html(user.email))</small></button>"#
        }.joined(separator: "\n")
        let page = """
            <!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
            <title>Sign in with Apple (simulator)</title>
            <style>
            body{font:16px/1.4 -apple-system,BlinkMacSystemFont,"Helvetica Neue",Arial,sans-serif;background:#f5f5f7;margin:0;display:flex;justify-content:center}
            main{background:#fff;margin:3rem 1rem;padding:2rem;border-radius:14px;max-width:26rem;width:100%;box-shadow:0 2px 12px rgba(0,0,0,.08)}
            h1{font-size:1.3rem;margin:.2rem 0 1rem} .note{color:#6e6e73;font-size:.85rem}
            .user{display:block;width:100%;text-align:left;padding:.8rem 1rem;margin:.5rem 0;border:1px solid #d2d2d7;border-radius:10px;background:#fff;font:inherit;cursor:pointer}
            .user:hover{border-color:#0071e3} .cancel{margin-top:1rem;background:none;border:none;color:#0071e3;font:inherit;cursor:pointer}
            </style></head><body><main>
            <p class="note">Apple ID simulator — not Apple</p>
            <h1>Use your Apple Account to sign in to \(Self.html(a.clientID))</h1>
            <form method="post" action="/auth/authorize/consent">\(hidden)
            \(choices)
            <button class="cancel" type="submit" name="action" value="cancel">Cancel</button>
            </form>
            <p class="note">Requested: \(a.scopes.isEmpty ? "no personal data" : Self.html(a.scopes.joined(separator: ", "))).</p>
            </main></body></html>
            """
        return SimulatorResponse(contentType: "text/html; charset=utf-8", page)
    }

    static func html(_ text: String) -> String {
        text.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
            .replacingOccurrences(of: ">", with: "&gt;").replacingOccurrences(of: "\"", with: "&quot;").replacingOccurrences(of: "'", with: "&#39;")
    }
}
