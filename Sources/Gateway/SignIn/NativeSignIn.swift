import AppleID
import Crypto
import Foundation
import HTTPProxy
import NIOCore
import NIOHTTP1
import Sessions

/// The native flow (apple-sign-in.md §7): an app posts what AuthenticationServices gave it, and
/// gets a session token. Optionally with a server nonce from `/native/nonce`.
extension AuthEndpointGuard {
    /// `POST /native/nonce` (`{client_id?}`) → `{nonce, nonce_sha256, expires_at}`: a single-use
    /// nonce the app hashes into `ASAuthorizationAppleIDRequest.nonce`; `/native` takes it back.
    /// Bound to the app's client id when one is named. Anonymous: within
    /// `apple.logins_per_minute` for `client` and `apple.max_pending_logins` for the instance.
    func issueNonce(body: ByteBuffer, client: String, on loop: any EventLoop) async -> LocalResponse {
        guard let apple = core.apple else { return Self.notConfigured() }
        var clientID: String? = nil
        if body.readableBytes > 0 {
            guard let object = try? JSONSerialization.jsonObject(with: Data(body.readableBytesView)) as? [String: Any] else {
                return SignInFailure.malformed("the body must be a JSON object or empty").json
            }
            if let value = object["client_id"] {
                guard let id = value as? String, apple.clientIDs.contains(id) else {
                    return SignInFailure.malformed("client_id must be one of the configured apple.client_ids").json
                }
                clientID = id
            }
        }
        do { try checkWrite(.nativeNonce, client: client) } catch { return error.json }
        let nonce = Self.randomToken()
        do {
            try await core.store.putNonce(sha256Hex(nonce), clientID: clientID ?? "", ttl: AnonymousWrites.lifetime, on: loop).get()
        } catch {
            core.metrics.recordSignInStart(.nativeNonce, outcome: .storeUnavailable)
            return SignInFailure.storeUnavailable.json
        }
        core.metrics.recordSignInStart(.nativeNonce, outcome: .ok)
        return AuthResponses.json(.ok, ["nonce": nonce, "nonce_sha256": sha256Hex(nonce), "expires_at": Self.iso8601(core.now() + AnonymousWrites.lifetime)])
    }

    /// `{identity_token, authorization_code, nonce?, user?}` → `{token, expires_at, user}`.
    func native(body: ByteBuffer, head: HTTPRequestHead, on loop: any EventLoop) async -> LocalResponse {
        guard let apple = core.apple else { return Self.notConfigured() }
        do {
            let request = try NativeRequest(head: head, body: body)
            // The identity token is checked before Apple is called: a forged one costs no call.
            let early: AppleIdentity
            do { early = try await apple.verifier.verify(request.identityToken, expectedNonce: nil) } catch { throw SignInFailure.identityToken(error) }
            let claimed = try await checkNonce(request.nonce, token: early, apple: apple, on: loop)
            try checkRate(.native, key: early.subject)
            // The code was issued to the app's own client id (the token's audience), no redirect_uri.
            let (identity, refreshToken) = try await exchange(apple, code: request.code, clientID: early.audience, redirectURI: nil, nonce: claimed).get()
            guard identity.subject == early.subject else { throw SignInFailure.otherUsersCode }
            // The unsigned name is stored with the session, only once Apple exchanged this user's
            // own code: a replayed identity token alone cannot rename its owner. (An app whose
            // exchange failed still holds the name and sends it with its retry.)
            await arriveByTransfer(identity, on: loop)
            let created = try await storeCall { try await auth.createSession(identity: identity, refreshToken: refreshToken, name: request.name, on: loop).get() }
            await lookUpLink(identity, on: loop)
            await endReplaced(presentedSession(head), on: loop)
            core.metrics.recordSignIn(flow: .native, outcome: .ok)
            core.logger.info("signed in", metadata: ["flow": "native", "sub": "\(identity.subject)"])
            return AuthResponses.json(.ok, ["token": created.cookie, "expires_at": Self.iso8601(created.expiresAt), "user": Self.userJSON(created.user, now: core.now())],
                                      headers: [auth.sessionCookie(created.cookie)])
        } catch let failure as SignInFailure {
            return counted(failure, flow: .native).json
        } catch {
            return counted(.storeUnavailable, flow: .native).json
        }
    }

    /// The nonce rule (`apple.native_nonce`): the value the token's `nonce` claim must hold, after
    /// checking what the app sent. The claim is the nonce itself or its SHA-256 (hex), as Apple's
    /// samples pass it. `required`: the nonce must be one `/native/nonce` issued, unused, for this
    /// app; it is used up here.
    private func checkNonce(_ nonce: String?, token: AppleIdentity, apple: AppleServices, on loop: any EventLoop) async throws -> String? {
        guard let nonce else {
            if auth.nativeNonceRequired { throw SignInFailure.nonce("a nonce from \(auth.prefix)/native/nonce is required") }
            return nil
        }
        let claim: String?
        if let value = token.nonce {
            guard IdentityTokenVerifier.constantTimeEqual(value, nonce) || IdentityTokenVerifier.constantTimeEqual(value, sha256Hex(nonce)) else {
                throw SignInFailure.identityToken(.nonceMismatch)
            }
            claim = value
        } else {
            // Without a nonce claim, proceed only when the platform says it has no nonces — and
            // never when a server nonce is required: the token would not be bound to it.
            guard token.nonceSupported == false, !auth.nativeNonceRequired else { throw SignInFailure.identityToken(.nonceMissing) }
            claim = nil
        }
        if auth.nativeNonceRequired {
            let boundTo = try await storeCall { try await core.store.takeNonce(sha256Hex(nonce), on: loop).get() }
            guard let boundTo else { throw SignInFailure.nonce("the nonce was not issued here, or was already used or expired") }
            guard boundTo.isEmpty || boundTo == token.audience else { throw SignInFailure.nonce("the nonce was issued for another app") }
        }
        return claim
    }
}

/// A native sign-in's body, read once.
struct NativeRequest {
    var identityToken: String
    var code: String
    var nonce: String?
    var name: String?

    init(head: HTTPRequestHead, body: ByteBuffer) throws(SignInFailure) {
        // A cross-site form can post `text/plain` that parses as JSON (login CSRF); a form
        // cannot send `application/json` without a CORS preflight.
        guard let type = head.headers.first(name: "content-type"), type.lowercased().hasPrefix("application/json") else { throw .notJSON }
        guard let object = try? JSONSerialization.jsonObject(with: Data(body.readableBytesView)) as? [String: Any] else {
            throw .malformed("the body must be a JSON object")
        }
        guard let idToken = object["identity_token"] as? String, !idToken.isEmpty,
              let code = object["authorization_code"] as? String, !code.isEmpty else {
            throw .malformed("identity_token and authorization_code are required strings")
        }
        let nonce = object["nonce"] as? String
        if object["nonce"] != nil, nonce == nil { throw .malformed("nonce must be a string") }
        self.identityToken = idToken
        self.code = code
        self.nonce = nonce
        // Apple's web shape (`user`), or the app's `credential.fullName` as it encodes it.
        self.name = AuthEndpointGuard.name(fromUser: object["user"]) ?? AuthEndpointGuard.name(fromParts: object["full_name"] ?? object["fullName"])
    }
}
