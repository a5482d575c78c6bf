import NIOCore

/// One signed-in session (DESIGN §3, `sg:session:{sub}:<hash>`). Times are Unix milliseconds.
public struct SessionRecord: Sendable, Equatable {
    public var handle: SessionHandle
    public var sub: String
    /// The client id the session was issued for (the Services ID on the web, an App ID natively).
    public var clientID: String
    public var created: Int64
    public var lastSeen: Int64
    /// The last successful validation with Apple (sign-in counts as one).
    public var validatedAt: Int64
    /// Apple's refresh token, sealed with `SessionKeys.seal` (never stored in the clear).
    public var sealedRefreshToken: String?

    public init(handle: SessionHandle, sub: String, clientID: String, created: Int64, lastSeen: Int64, validatedAt: Int64, sealedRefreshToken: String?) {
        self.handle = handle
        self.sub = sub
        self.clientID = clientID
        self.created = created
        self.lastSeen = lastSeen
        self.validatedAt = validatedAt
        self.sealedRefreshToken = sealedRefreshToken
    }

    /// Stands for a sealed refresh token that the record is held without, present in the store:
    /// the local cache keeps sessions without theirs (about 180 bytes each, read once a day, by
    /// the re-validation). Never a sealed value (sealing gives at least 38 characters).
    public static let tokenInStore = ""

    /// `self` with its sealed token, if any, replaced by `tokenInStore`.
    public var withoutToken: SessionRecord {
        var r = self
        if r.sealedRefreshToken != nil { r.sealedRefreshToken = Self.tokenInStore }
        return r
    }
}

/// What the gateway knows about a user (`sg:user:{sub}`). Every field but `sub` is optional:
/// Apple sends the name once, the email only with the `email` scope.
public struct UserProfile: Sendable, Equatable {
    public var sub: String
    public var name: String?
    public var email: String?
    public var emailVerified: Bool?
    public var privateEmail: Bool?
    /// `enabled`/`disabled`, from Apple's email notifications.
    public var emailForwarding: String?
    public var realUserStatus: Int?
    /// The `event_time` (Unix ms) of the last email notification applied: an older one that
    /// arrives late is ignored.
    public var emailEventAt: Int64?
    /// The user's `sub` at the team the app was transferred from, when this store knew it
    /// (`migrate import` or a sign-in mapped the user): `allow.users` entries naming it still match.
    public var formerSub: String?
    /// When the user was mapped to this `sub` after an app transfer (Unix ms): the app is told
    /// `formerSub` on each request for `TransferArrival.period` from then.
    public var transferredAt: Int64?

    public init(sub: String, name: String? = nil, email: String? = nil, emailVerified: Bool? = nil, privateEmail: Bool? = nil,
                emailForwarding: String? = nil, realUserStatus: Int? = nil, emailEventAt: Int64? = nil, formerSub: String? = nil,
                transferredAt: Int64? = nil) {
        self.formerSub = formerSub
        self.transferredAt = transferredAt
        self.sub = sub
        self.name = name
        self.email = email
        self.emailVerified = emailVerified
        self.privateEmail = privateEmail
        self.emailForwarding = emailForwarding
        self.realUserStatus = realUserStatus
        self.emailEventAt = emailEventAt
    }

    /// `self` with every field `update` has replaced; absent fields are kept (a later sign-in
    /// without the name keeps the stored name).
    public func merged(with update: UserProfile) -> UserProfile {
        var p = self
        if let v = update.name { p.name = v }
        if let v = update.email { p.email = v }
        if let v = update.emailVerified { p.emailVerified = v }
        if let v = update.privateEmail { p.privateEmail = v }
        if let v = update.emailForwarding { p.emailForwarding = v }
        if let v = update.realUserStatus { p.realUserStatus = v }
        if let v = update.emailEventAt { p.emailEventAt = v }
        if let v = update.formerSub { p.formerSub = v }
        if let v = update.transferredAt { p.transferredAt = v }
        return p
    }

    /// The former `sub` the app is told about at `now` (Unix ms): during the transfer period
    /// after the mapping (`TransferArrival.period`), then nil.
    public func formerSub(at now: Int64) -> String? {
        guard let formerSub, let transferredAt, now < transferredAt + TransferArrival.period else { return nil }
        return formerSub
    }

    var fields: [(String, String)] {
        var f: [(String, String)] = []
        if let name { f.append(("name", name)) }
        if let email { f.append(("email", email)) }
        if let emailVerified { f.append(("email_verified", emailVerified ? "true" : "false")) }
        if let privateEmail { f.append(("private_email", privateEmail ? "true" : "false")) }
        if let emailForwarding { f.append(("email_forwarding", emailForwarding)) }
        if let realUserStatus { f.append(("real_user_status", String(realUserStatus))) }
        if let emailEventAt { f.append(("email_event_at", String(emailEventAt))) }
        if let formerSub { f.append(("former_sub", formerSub)) }
        if let transferredAt { f.append(("transferred_at", String(transferredAt))) }
        return f
    }
}

/// A session as admission needs it: the session, its user, and the user's revocation time.
public struct StoredSession: Sendable, Equatable {
    public var session: SessionRecord
    public var user: UserProfile
    /// Sessions created before this (Unix ms) are dead.
    public var revokedAt: Int64?
    /// The legacy app's account id linked to this Apple identity (`link:{sub}`), if any.
    public var account: String?

    public init(session: SessionRecord, user: UserProfile, revokedAt: Int64?, account: String? = nil) {
        self.account = account
        self.session = session
        self.user = user
        self.revokedAt = revokedAt
    }

    public var isRevoked: Bool { revokedAt.map { session.created <= $0 } ?? false }
}

/// The outcome of validating a refresh token with Apple, shared by the fleet. Also a client's
/// circuit (`Revalidator`: the record of `client:<client id>`, open after `invalid_client`).
public struct ValidationRecord: Sendable, Equatable {
    public enum Result: String, Sendable { case ok, revoked, failed }
    public var result: Result
    /// Unix ms.
    public var at: Int64
    /// Failed attempts in a row (0 unless `failed`).
    public var failures: Int
    /// No attempt before this time (Unix ms; 0: none scheduled): the backoff, or Apple's `Retry-After`.
    public var retryAt: Int64
    public init(result: Result, at: Int64, failures: Int = 0, retryAt: Int64 = 0) {
        self.result = result
        self.at = at
        self.failures = failures
        self.retryAt = retryAt
    }
}

/// One user of an app transfer (`transfer:{transfer id}`, TN3159): what the sending team
/// exported and what became of it at the recipient. It keeps only what the mapping needs, for
/// as long as Apple's 60-day transfer period can need it:
///
/// - `data` (the exported line: name, real email, link) until the user is mapped; the write
///   that maps them (`to`) drops it (the profile holds it now), leaving only identifiers.
/// - Each write keeps the record `TransferRecord.lifetime` (90 days) from then: the 60-day
///   transfer period, plus 30 days for an export made before the transfer. Running the export
///   or the import again renews it.
public struct TransferRecord: Sendable, Equatable {
    public static let lifetime: Int64 = 90 * 86_400_000
    /// Apple's transfer id (`transfer_sub`).
    public var id: String
    /// The sending team's `sub`: set when `migrate export` ran against this store (the same
    /// operator on both sides of the transfer).
    public var from: String?
    /// The recipient's Team ID the export asked Apple for (with `from`): an id is only good for
    /// that team, so an export for another team asks Apple again.
    public var target: String?
    /// The user's exported line (JSON), once `migrate import` loaded it; dropped when the user
    /// is mapped.
    public var data: String?
    /// The recipient team's `sub`, once mapped (by `migrate import` or at sign-in).
    public var to: String?
    /// When it was mapped (Unix ms).
    public var mappedAt: Int64?

    public init(id: String, from: String? = nil, target: String? = nil, data: String? = nil, to: String? = nil, mappedAt: Int64? = nil) {
        self.id = id
        self.from = from
        self.target = target
        self.data = data
        self.to = to
        self.mappedAt = mappedAt
    }

    /// `self` with every field `update` sets; an update that maps the user (`to`) drops `data`.
    public func merged(with update: TransferRecord) -> TransferRecord {
        var r = self
        if let v = update.from { r.from = v }
        if let v = update.target { r.target = v }
        if let v = update.data { r.data = v }
        if let v = update.to { r.to = v; r.data = nil }
        if let v = update.mappedAt { r.mappedAt = v }
        return r
    }

    var fields: [(String, String)] {
        [("from", from), ("target", target), ("data", data), ("to", to), ("mapped_at", mappedAt.map(String.init))].compactMap { name, value in value.map { (name, $0) } }
    }
}

/// What a revocation removes besides the sessions it ends (issue 25 §2: disconnecting is not
/// deleting).
public enum Forgetting: String, Sendable, Equatable, Codable {
    /// Nothing: an operator's revoke. The user's profile, tokens and link stay.
    case nothing
    /// The refresh tokens granted up to the revocation (dead at Apple, or revoked there): consent
    /// revoked, the user's disconnect, `invalid_grant`. The profile and the link to a legacy
    /// account stay, so a returning user is the same account; a token granted after it (the
    /// user consented again) stays too.
    case grants
    /// Everything the store holds of the user — profile, every token, the link — whatever
    /// happened since: Apple's `account-delete` (the `sub` can never sign in again),
    /// `sessions revoke --forget`, a transferred user's former `sub`.
    case everything
}

/// Why a session ended, as its client is told (the 401's `reason`): kept by the store beside
/// the session it ended (`SessionStore.end(of:)`) for as long as its cookie could be presented.
public enum SessionEnd: String, Sendable, CaseIterable, Codable {
    /// A logout, or a new sign-in that replaced it.
    case signedOut = "signed_out"
    /// The user's consent ended: Apple's `consent-revoked`, a disconnect, `invalid_grant`, an
    /// operator's revoke.
    case revoked
    /// The account was deleted (Apple's `account-delete`, the user's, an operator's `--forget`).
    case deleted
    /// An app transfer gave the user a new `sub`: sign in again to get it.
    case transferred
    /// Its idle or absolute timeout passed — or the store no longer knows why.
    case expired
}

/// What `SessionStore.revoke` did.
public struct Revocation: Sendable, Equatable {
    /// Live sessions ended.
    public var ended: Int
    /// A session created, or a token granted, after the revocation survives: the user came back
    /// since, and the revocation concerned an older grant (nothing of the newer one was touched).
    public var superseded: Bool

    public init(ended: Int, superseded: Bool) {
        self.ended = ended
        self.superseded = superseded
    }
}

/// What `SessionStore.link` did.
public enum LinkResult: Sendable, Equatable {
    case linked
    /// The account is already linked to this other identity: nothing changed.
    case conflict(sub: String)
}

/// A web login between `/login` and `/callback` (`sg:login:{state}`): single use, 10 minutes.
public struct LoginState: Sendable, Equatable {
    public var nonce: String
    /// Where to go after sign-in: a validated path or allow-listed URL.
    public var returnTo: String
    /// SHA-256 (hex) of the pre-auth cookie's value: binds the login to one browser.
    public var binding: String
    /// The session this browser presented when the login started (`SessionHandle.reference`): ended
    /// when the new one is created (Apple's callback is a cross-site POST, so the `Lax` session
    /// cookie does not arrive with it).
    public var previousSession: String?
    /// SHA-256 (hex) of the ticket cookie the browser holds on `returnTo`'s host, when that is
    /// another routed host outside the session cookie's domain: the one-time ticket that carries
    /// the session there redeems only in that browser (`SignInTicket`).
    public var ticketBinding: String?

    public init(nonce: String, returnTo: String, binding: String, previousSession: String? = nil, ticketBinding: String? = nil) {
        self.nonce = nonce
        self.returnTo = returnTo
        self.binding = binding
        self.previousSession = previousSession
        self.ticketBinding = ticketBinding
    }
}

/// A store failed to answer (down, slow, or nonsense): admission answers 503 and keeps the
/// cookie; nothing is concluded about the session.
public struct SessionStoreError: Error, CustomStringConvertible {
    public var reason: String
    /// What kind of failure, for code that acts on it (readiness, the log, `check --online`).
    public var fault: StoreFault
    public init(_ reason: String, fault: StoreFault = .other) {
        self.reason = reason
        self.fault = fault
    }

    /// The store's own error, kept by kind.
    public init(_ error: any Error) {
        if let error = error as? SessionStoreError {
            self = error
        } else {
            self.init("\(error)", fault: StoreFault(error))
        }
    }

    public var description: String { "session store unavailable: \(reason)" }
}

/// Where sessions live: memory (one instance) or Redis (a fleet). Both implementations pass
/// the same contract suite (`Tests/SessionsTests/SessionStoreContract.swift`). Every call
/// answers on `eventLoop` and fails only with `SessionStoreError`.
public protocol SessionStore: Sendable {
    /// Saves a new session (expiring at `expiresAt`) and merges `profile` into the user's.
    func create(_ session: SessionRecord, profile: UserProfile, expiresAt: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// The session with its user and revocation marker; nil when unknown or expired.
    func load(_ handle: SessionHandle, on eventLoop: any EventLoop) -> EventLoopFuture<StoredSession?>
    /// Records activity: `last_seen` and the new expiry (idle timeout, capped by the absolute one).
    func touch(_ handle: SessionHandle, lastSeen: Int64, expiresAt: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// Ends one session (logout), remembering why (`end`) for `keep` milliseconds.
    func delete(_ handle: SessionHandle, sub: String, end: SessionEnd, keep: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// Why the session `handle` names ended (`delete`, `revoke`); nil when the store never
    /// ended it, or has forgotten.
    func end(of handle: SessionHandle, on eventLoop: any EventLoop) -> EventLoopFuture<SessionEnd?>
    /// The user's live sessions, oldest first.
    func sessions(of sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<[SessionRecord]>
    /// Records `revokedAt` for the user (a later revocation already recorded wins), kept `keep`
    /// milliseconds (sessions older than that are gone anyway: the absolute timeout), and
    /// deletes the sessions created up to it. A session created after `revokedAt`, or a token
    /// granted after it (the user consented again before a late notification), is kept: the
    /// revocation is then `superseded`. `forget` says what else goes (`Forgetting`). A
    /// revocation of the grants that nothing superseded leaves the profile and tokens to expire
    /// with the marker (`keep`) unless the user signs in again (`create` keeps them); the link
    /// to a legacy account is kept (only `.everything` removes it). Each session it deletes
    /// remembers `end` for `keep` (`end(of:)`). With `clients` (one app group's consent), only
    /// the sessions and tokens of those client ids go, and no marker is written (the user's
    /// other groups live on); the profile is kept.
    func revoke(_ sub: String, at revokedAt: Int64, keep: Int64, forget: Forgetting, end: SessionEnd, clients: Set<String>?,
                on eventLoop: any EventLoop) -> EventLoopFuture<Revocation>
    /// Keeps the user's latest refresh token for `clientID` (sealed for the user), granted at
    /// `grantedAt` (Unix ms: the sign-in), beyond their sessions, so that a deletion can revoke
    /// it at Apple; a revocation of the grants removes it only when it was granted up to then.
    func saveRefreshToken(_ sealed: String, clientID: String, grantedAt: Int64, of sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// The user's stored refresh tokens (sealed), by client id.
    func refreshTokens(of sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<[String: String]>
    /// Saves (or replaces) a job of the store-backed outbox.
    func putJob(_ job: OutboxJob, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// Every job of the outbox (it is small: failures waiting for a retry).
    func jobs(on eventLoop: any EventLoop) -> EventLoopFuture<[OutboxJob]>
    /// One job of the outbox, if still there.
    func job(id: String, on eventLoop: any EventLoop) -> EventLoopFuture<OutboxJob?>
    /// Removes a job once done (or given up).
    func removeJob(id: String, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// Merges fields into the user's profile (creating it).
    func saveProfile(_ profile: UserProfile, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// The user's profile, if any.
    func profile(of sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<UserProfile?>
    /// Saves a login for `ttl` milliseconds.
    func putLogin(state: String, _ login: LoginState, ttl: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// Takes a login out: the second call for the same state answers nil.
    func takeLogin(state: String, on eventLoop: any EventLoop) -> EventLoopFuture<LoginState?>
    /// Keeps an issued native nonce (`nonce:{hash}`, its SHA-256) for `ttl` milliseconds, with
    /// the client id it is bound to ("" for none).
    func putNonce(_ hash: String, clientID: String, ttl: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// Takes an issued nonce out (single use): its client id, or nil when unknown, used or expired.
    func takeNonce(_ hash: String, on eventLoop: any EventLoop) -> EventLoopFuture<String?>
    /// Takes `claim` for `ttl` milliseconds; true only for the one caller that gets it,
    /// fleet-wide (Redis `SET NX PX`).
    func claim(_ claim: Claim, ttl: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Bool>
    /// Gives a claim up (a lock released; a notification whose processing failed).
    func release(_ claim: Claim, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// The fleet's last re-validation result for a refresh token (`validation:<token hash>`).
    func validation(of tokenHash: String, on eventLoop: any EventLoop) -> EventLoopFuture<ValidationRecord?>
    /// Records a re-validation result for `ttl` milliseconds.
    func recordValidation(_ record: ValidationRecord, of tokenHash: String, ttl: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// Sets a session's `validated_at`.
    func markValidated(_ handle: SessionHandle, at: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// Links the Apple identity `sub` to the legacy app's `account` (`link:{sub}` and the reverse
    /// `account:{account}`). An account is linked to one identity and an identity to one account:
    /// answers `.conflict` with the identity already holding the account; relinking a `sub` to
    /// another account moves it.
    func link(_ sub: String, to account: String, on eventLoop: any EventLoop) -> EventLoopFuture<LinkResult>
    /// Removes `sub`'s link (and its reverse); answers the account it was linked to.
    func unlink(_ sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<String?>
    /// The account linked to `sub`.
    func account(linkedTo sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<String?>
    /// Every user the store holds a profile for (`migrate export`), in no particular order.
    func users(on eventLoop: any EventLoop) -> EventLoopFuture<[String]>
    /// Merges the fields `record` sets into the transfer record of `record.id` (creating it); a
    /// record that sets `to` drops the stored `data`. The record lasts `TransferRecord.lifetime`
    /// from this write.
    func putTransfer(_ record: TransferRecord, on eventLoop: any EventLoop) -> EventLoopFuture<Void>
    /// The transfer record of a transfer id, if any.
    func transfer(_ id: String, on eventLoop: any EventLoop) -> EventLoopFuture<TransferRecord?>
    /// Every transfer record (the export's resume, `check --transfer`).
    func transfers(on eventLoop: any EventLoop) -> EventLoopFuture<[TransferRecord]>
    /// Records `url` as the Apple return URL the fleet runs with, and answers the one recorded
    /// before (nil the first time): a start that moved it is said loudly (issue 28 §1). Kept
    /// without expiry (`sg:apple_return_url`); the memory store's fleet is its process.
    func swapReturnURL(_ url: String, on eventLoop: any EventLoop) -> EventLoopFuture<String?>
    /// The Apple return URL the fleet last recorded (`check --online` compares the file's).
    func returnURL(on eventLoop: any EventLoop) -> EventLoopFuture<String?>
    /// Succeeds when the store takes a write (readiness): a demoted or full Redis fails it.
    func ping(on eventLoop: any EventLoop) -> EventLoopFuture<Void>
}

extension SessionStore {
    /// `revoke` of every client's sessions and tokens.
    public func revoke(_ sub: String, at revokedAt: Int64, keep: Int64, forget: Forgetting, end: SessionEnd, on eventLoop: any EventLoop) -> EventLoopFuture<Revocation> {
        revoke(sub, at: revokedAt, keep: keep, forget: forget, end: end, clients: nil, on: eventLoop)
    }
}
