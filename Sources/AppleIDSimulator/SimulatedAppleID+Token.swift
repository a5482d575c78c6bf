import Crypto
import Foundation
import NIOCore
import NIOHTTP1

/// `/auth/token` and `/auth/revoke` (apple-sign-in.md §3, §7), checked in the order of §3.7.
extension SimulatedAppleID {
    /// Codes live 5 minutes and are single use (§3.6).
    static let codeLifetime: Int64 = 300

    // MARK: test and control surface

    /// Creates a user; returns its `sub`.
    @discardableResult
    /// - Parameter emailVerified: false for a Managed Apple Account (Work & School) whose email
    ///   Apple did not verify; every other Apple Account's is.
    public func createUser(email: String? = nil, privateEmail: Bool = true, emailVerified: Bool = true, realUserStatus: Int = 2, firstName: String = "Jane",
                           lastName: String = "Appleseed", sub: String? = nil) -> String {
        let sub = sub ?? Grants.subject()
        let address = email ?? (privateEmail ? Grants.relayAddress(for: sub) : "user@example.org")
        grants.withLockedValue {
            $0.users[sub] = Grants.User(sub: sub, email: address, isPrivateEmail: privateEmail, emailVerified: emailVerified, realUserStatus: realUserStatus,
                                        firstName: firstName, lastName: lastName)
        }
        return sub
    }

    /// Issues an authorization code as a completed `/auth/authorize` would.
    public func issueCode(sub: String, clientID: String, redirectURI: String?, nonce: String?, firstAuthorization: Bool = false) -> String {
        let code = Grants.opaqueToken(prefix: "c")
        let now = clock()
        grants.withLockedValue {
            $0.codes[code] = Grants.Code(sub: sub, clientID: clientID, redirectURI: redirectURI, nonce: nonce, issuedAt: now, firstAuthorization: firstAuthorization)
        }
        return code
    }

    /// The user stops using Sign in with Apple with this team: every refresh token dies.
    public func revokeConsent(sub: String) {
        grants.withLockedValue { g in
            for (token, grant) in g.refreshTokens where grant.sub == sub { g.refreshTokens[token]?.revoked = true }
            // The next authorization is a first one again: the `user` JSON comes back (§1.3).
            g.users[sub]?.authorized = false
        }
    }

    /// Whether a refresh token is still valid at the simulated Apple.
    public func isRefreshTokenValid(_ token: String) -> Bool {
        grants.withLockedValue { $0.refreshTokens[token].map { !$0.revoked } ?? false }
    }

    // MARK: endpoints

    static func withRetryAfter(_ response: SimulatorResponse, _ faults: Faults) -> SimulatorResponse {
        var response = response
        if let seconds = faults.retryAfter { response.headers.append(("retry-after", String(seconds))) }
        return response
    }

    func tokenEndpoint(_ request: SimulatorRequest) -> SimulatorResponse {
        let faults = self.faults.withLockedValue { $0 }
        let form: [String: String]
        switch Self.formFields(request) {
        case .refused(let response): return response
        case .ok(let fields): form = fields
        }
        guard let clientID = form["client_id"], let secret = form["client_secret"] else {
            return Self.error(.badRequest, "invalid_request", "client_id and client_secret are required")
        }
        if faults.strictClientAuthentication, request.head.headers.first(name: "authorization")?.lowercased().hasPrefix("basic ") == true {
            return Self.error(.badRequest, "invalid_request", "more than one mechanism for authenticating the client")
        }
        guard let grantType = form["grant_type"], ["authorization_code", "refresh_token", "client_credentials"].contains(grantType) else {
            return Self.error(.badRequest, "unsupported_grant_type")
        }
        countGrant(grantType)
        if let status = faults.tokenFailureStatus { return Self.withRetryAfter(Self.error(HTTPResponseStatus(statusCode: status), "server_error"), faults) }
        guard team.clients[clientID] != nil else { return Self.error(.badRequest, "invalid_client", "unknown client_id") }
        if faults.rejectClientSecrets { return Self.error(.badRequest, "invalid_client") }
        let now = clock()
        if let failure = ClientSecretValidator(teamID: team.teamID, keys: team.keys).validate(secret, clientID: clientID, now: now) {
            return Self.error(.badRequest, "invalid_client", failure.rawValue)
        }
        switch grantType {
        case "authorization_code":
            guard let code = form["code"] else { return Self.error(.badRequest, "invalid_request", "code is required") }
            let result: GrantCheck<Grants.Code> = grants.withLockedValue { g in
                guard var grant = g.codes[code] else { return .refused(Self.error(.badRequest, "invalid_grant", "The code has expired or has been revoked.")) }
                guard !grant.used else { return .refused(Self.error(.badRequest, "invalid_grant", "The code has already been used.")) }
                guard now - grant.issuedAt < Self.codeLifetime else { return .refused(Self.error(.badRequest, "invalid_grant", "The code has expired or has been revoked.")) }
                guard grant.clientID == clientID else { return .refused(Self.error(.badRequest, "invalid_grant", "code was issued to another client")) }
                // Single use: a failed exchange (a wrong redirect_uri) burns the code too.
                grant.used = true
                g.codes[code] = grant
                guard grant.redirectURI == form["redirect_uri"] else { return .refused(Self.error(.badRequest, "invalid_grant", "redirect_uri does not match")) }
                return .ok(grant)
            }
            switch result {
            case .refused(let response): return response
            case .ok(let grant):
                let refresh = Grants.opaqueToken(prefix: "r"), access = Grants.opaqueToken(prefix: "a")
                grants.withLockedValue { g in
                    g.refreshTokens[refresh] = Grants.RefreshToken(sub: grant.sub, clientID: clientID, lastValidated: now)
                    g.accessTokens[access] = grant.sub
                }
                var body: [String: Any] = ["access_token": access, "token_type": "Bearer", "expires_in": faults.accessTokenLifetime, "refresh_token": refresh]
                body["id_token"] = try? identityToken(sub: grant.sub, clientID: clientID, nonce: grant.nonce, now: now, faults: faults, accessToken: access,
                                                      firstAuthorization: grant.firstAuthorization)
                return Self.json(body)
            }
        case "refresh_token":
            guard let token = form["refresh_token"], !faults.refreshMalformed else { return Self.error(.badRequest, "invalid_request", "refresh_token is required") }
            let outcome: GrantCheck<Grants.RefreshToken> = grants.withLockedValue { g in
                guard var grant = g.refreshTokens[token], grant.clientID == clientID else {
                    return .refused(Self.error(.badRequest, "invalid_grant", "The refresh token is invalid."))
                }
                guard !grant.revoked else { return .refused(Self.error(.badRequest, faults.revokedRefreshError, "The refresh token has been revoked.")) }
                if faults.throttleInterval > 0, let last = grant.lastValidated, now - last < faults.throttleInterval {
                    return .refused(Self.withRetryAfter(Self.error(HTTPResponseStatus(statusCode: faults.throttleStatus), "too_many_requests"), faults))
                }
                grant.lastValidated = now
                g.refreshTokens[token] = grant
                return .ok(grant)
            }
            switch outcome {
            case .refused(let response): return response
            case .ok(let grant):
                let access = Grants.opaqueToken(prefix: "a")
                grants.withLockedValue { $0.accessTokens[access] = grant.sub }
                var body: [String: Any] = ["access_token": access, "token_type": "Bearer", "expires_in": faults.accessTokenLifetime]
                if faults.refreshReturnsIDToken {
                    body["id_token"] = try? identityToken(sub: grant.sub, clientID: clientID, nonce: nil, now: now, faults: faults, accessToken: access)
                }
                return Self.json(body)
            }
        default:
            guard form["scope"] == "user.migration" else { return Self.error(.badRequest, "invalid_scope") }
            let access = Grants.opaqueToken(prefix: "a")
            let dead = self.faults.withLockedValue { f in
                guard f.deadMigrationTokens > 0 else { return false }
                f.deadMigrationTokens -= 1
                return true
            }
            grants.withLockedValue {
                $0.accessTokens[access] = ""
                $0.accessTokenExpiry[access] = dead ? now : now + 3600
            }
            return Self.json(["access_token": access, "token_type": "Bearer", "expires_in": 3600])
        }
    }

    func revokeEndpoint(_ request: SimulatorRequest) -> SimulatorResponse {
        if let status = faults.withLockedValue({ $0.revokeFailureStatus }) { return Self.error(HTTPResponseStatus(statusCode: status), "server_error") }
        let form: [String: String]
        switch Self.formFields(request) {
        case .refused(let response): return response
        case .ok(let fields): form = fields
        }
        guard let clientID = form["client_id"], let secret = form["client_secret"], let token = form["token"] else {
            return Self.error(.badRequest, "invalid_request")
        }
        guard team.clients[clientID] != nil,
              ClientSecretValidator(teamID: team.teamID, keys: team.keys).validate(secret, clientID: clientID, now: clock()) == nil else {
            return Self.error(.badRequest, "invalid_client")
        }
        let (foreign, revokedSub): (Bool, String?) = grants.withLockedValue { g in
            if let owner = g.refreshTokens[token]?.clientID, owner != clientID { return (true, nil) }
            let sub = g.refreshTokens[token]?.sub ?? g.accessTokens[token].flatMap { $0.isEmpty ? nil : $0 }
            g.accessTokens[token] = nil
            if let sub {
                // Apple: the tokens *and the associated user authorization* (§7): every refresh
                // token of the user at this team dies, and the next sign-in is a first one (the
                // `user` JSON comes back).
                for (other, grant) in g.refreshTokens where grant.sub == sub { g.refreshTokens[other]?.revoked = true }
                g.users[sub]?.authorized = false
            }
            return (false, sub)
        }
        let faults = self.faults.withLockedValue { $0 }
        if foreign, faults.rejectForeignRevoke { return Self.error(.badRequest, "invalid_grant") }
        if let revokedSub, faults.notifyOnRevoke, let url = notificationURL {
            Task { _ = await self.sendNotification(.consentRevoked, sub: revokedSub, to: url) }
        }
        // 200 with an empty body, also for unknown tokens (§7).
        return SimulatorResponse(contentType: "text/plain", body: ByteBuffer())
    }

    /// The fields of a form-encoded POST, or its refusal: another content type, a malformed body
    /// or a duplicated field are all `invalid_request` at Apple (§3.1, §3.5).
    static func formFields(_ request: SimulatorRequest) -> GrantCheck<[String: String]> {
        guard let type = request.head.headers.first(name: "content-type"), type.lowercased().hasPrefix("application/x-www-form-urlencoded") else {
            return .refused(Self.error(.badRequest, "invalid_request", "invalid content type"))
        }
        switch URLEncodedForm.parse(Array(request.body.readableBytesView)) {
        case .success(let fields): return .ok(fields)
        case .failure(let failure): return .refused(Self.error(.badRequest, "invalid_request", failure.description))
        }
    }

    /// An identity token as `/auth/token` issues it (§6.5): string or JSON booleans by fault.
    /// OIDC's hash of a code or an access token: the left half of its SHA-256, base64url.
    static func halfHash(_ value: String) -> String {
        CompactJWS.encodeBase64URL(Data(Array(SHA256.hash(data: Data(value.utf8))).prefix(16)))
    }

    /// - Parameters:
    ///   - code: issued beside the token (the authorize redirect): the token carries its `c_hash`.
    ///   - accessToken: issued with the token (`/auth/token`): the token carries its `at_hash`.
    ///   - firstAuthorization: the user's first authorization of the group: `real_user_status`
    ///     (native) comes only then.
    func identityToken(sub: String, clientID: String, nonce: String?, now: Int64, faults: Faults, code: String? = nil, accessToken: String? = nil,
                       firstAuthorization: Bool = false) throws -> String {
        guard let user = grants.withLockedValue({ $0.users[sub] }) else { throw SimulatorError.unknownUser }
        let isNative = team.clients[clientID]?.isEmpty ?? false
        func boolean(_ value: Bool) -> Any { faults.stringBooleans ? (value ? "true" : "false") : value }
        var claims: [String: Any] = [
            "iss": "https://appleid.apple.com", "aud": clientID, "iat": now, "exp": now + faults.idTokenTTL, "sub": sub,
            "auth_time": now, "nonce_supported": true,
        ]
        // The email claims only when the user granted the email scope (the first time).
        if user.grantedScopes.contains("email") {
            claims["email"] = user.email
            claims["email_verified"] = boolean(user.emailVerified)
            if user.isPrivateEmail || faults.statesSharedEmail { claims["is_private_email"] = boolean(user.isPrivateEmail) }
        }
        if faults.nonceUnsupported {
            claims["nonce_supported"] = false
        } else if let nonce {
            claims["nonce"] = nonce
        }
        if let code { claims["c_hash"] = faults.wrongCodeHash ? Self.halfHash(code + "x") : Self.halfHash(code) }
        if let accessToken { claims["at_hash"] = Self.halfHash(accessToken) }
        if let transferSub = activeTransferID(for: sub, now: now) { claims["transfer_sub"] = transferSub }
        if isNative, firstAuthorization { claims["real_user_status"] = user.realUserStatus }
        return try signingKeys.sign(claims)
    }
}

enum SimulatorError: Error { case unknownUser }

/// A check of a request: what it carries (a grant, an authorization, a form), or the error
/// response that refuses it.
enum GrantCheck<Grant> {
    case ok(Grant)
    case refused(SimulatorResponse)
}
