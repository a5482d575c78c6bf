import NIOCore

/// Moves one transferred user (TN3159) to their `sub` at the recipient team: the profile, the
/// link to a legacy account, the end of the old identity's sessions and the transfer record's
/// mapping. Run by `migrate import`, or at the user's first sign-in at the recipient when the
/// identity token's `transfer_sub` names a record the import did not map. Idempotent.
///
/// A store-level operation like `SessionStore.revoke`: it takes its time as a value and is built
/// from store calls only (each bounded by the store's own command timeout), so that the batch
/// job and the sign-in path run the same step.
public enum TransferArrival {
    /// What the sending team's export said of the user (the transfer file's line): used where
    /// this store did not know them under their old `sub`.
    public struct Exported: Sendable, Equatable {
        public var account: String?
        public var name: String?
        /// A real (non-relay) address only.
        public var email: String?
        public var emailVerified: Bool?
        public var realUserStatus: Int?

        public init(account: String? = nil, name: String? = nil, email: String? = nil, emailVerified: Bool? = nil, realUserStatus: Int? = nil) {
            self.account = account
            self.name = name
            self.email = email
            self.emailVerified = emailVerified
            self.realUserStatus = realUserStatus
        }
    }

    /// What the move did.
    public struct Outcome: Sendable, Equatable {
        public var sessionsEnded = 0
        /// The legacy account now linked to the new identity.
        public var account: String?
        /// The new identity is already linked to another account (kept), or the account to
        /// another identity: not linked.
        public var linkConflict = false
        /// Another mover (an import, a sign-in) mapped the user while this one waited: nothing
        /// was done here (and nothing is to be announced again).
        public var alreadyMapped = false

        public init(sessionsEnded: Int = 0, account: String? = nil, linkConflict: Bool = false, alreadyMapped: Bool = false) {
            self.sessionsEnded = sessionsEnded
            self.account = account
            self.linkConflict = linkConflict
            self.alreadyMapped = alreadyMapped
        }
    }

    /// How long a mover holds the user's claim (`Claim.transfer`), in milliseconds.
    static let claimTTL: Int64 = 60_000

    /// How long after the mapping the app is told the user's former `sub` (`UserProfile.formerSub(at:)`),
    /// in milliseconds: 60 days, Apple's transfer period (TN3159). The gateway does not know
    /// when the transfer completed, only that the mapping happened inside the period; counting
    /// from the mapping never ends the hint before the period does (README "App transfers").
    public static let period: Int64 = 60 * 86_400_000

    /// - Parameters:
    ///   - record: the transfer record as last read (its `from` and `data` say what to move).
    ///   - email: the new relay address Apple gave (relay users only).
    ///   - privateEmail: whether `email` is a relay address.
    ///   - exported: the record's `data`, decoded by its owner.
    ///   - t: now (Unix ms): when the old identity's sessions end and the mapping is recorded.
    ///   - keep: how long the old identity's revocation marker lasts (the absolute timeout).
    /// Answers nil when another process (an import, a sign-in) is moving the same user now.
    public static func apply(_ record: TransferRecord, to sub: String, email: String?, privateEmail: Bool, exported: Exported?, store: any SessionStore,
                             at t: Int64, keep: Int64, on loop: any EventLoop) async throws -> Outcome? {
        // One mover at a time per user: the import and a sign-in may meet here.
        guard try await store.claim(.transfer(id: record.id), ttl: claimTTL, on: loop).get() else { return nil }
        do {
            let outcome = try await move(record, to: sub, email: email, privateEmail: privateEmail, exported: exported, store: store, at: t, keep: keep, on: loop)
            try? await store.release(.transfer(id: record.id), on: loop).get()
            return outcome
        } catch {
            try? await store.release(.transfer(id: record.id), on: loop).get()
            throw error
        }
    }

    private static func move(_ record: TransferRecord, to sub: String, email: String?, privateEmail: Bool, exported line: Exported?, store: any SessionStore,
                             at t: Int64, keep: Int64, on loop: any EventLoop) async throws -> Outcome {
        if let to = try await store.transfer(record.id, on: loop).get()?.to, to == sub { return Outcome(alreadyMapped: true) }  // done while we waited
        // What this store knew under the old sub (the same operator on both sides), else the file's.
        let old = try await record.from.asyncMap { try await store.profile(of: $0, on: loop).get() } ?? nil
        var profile = UserProfile(sub: sub, name: old?.name ?? line?.name, realUserStatus: old?.realUserStatus ?? line?.realUserStatus, formerSub: record.from,
                                  transferredAt: record.from == nil ? nil : t)
        if let email {
            // Apple's: the exchange's new relay address, or the signed token's at a sign-in.
            (profile.email, profile.emailVerified, profile.privateEmail) = (email, true, privateEmail)
        } else if let known = old?.privateEmail == false ? old?.email : line?.email {
            (profile.email, profile.emailVerified, profile.privateEmail) = (known, old?.emailVerified ?? line?.emailVerified, false)
        }
        // Fields the new identity already has (its sign-in's) win.
        let existing = try await store.profile(of: sub, on: loop).get()
        try await store.saveProfile(existing.map { profile.merged(with: $0) } ?? profile, on: loop).get()

        var outcome = Outcome()
        let oldAccount = try await record.from.asyncMap { try await store.account(linkedTo: $0, on: loop).get() } ?? nil
        let current = try await store.account(linkedTo: sub, on: loop).get()
        if let account = oldAccount ?? line?.account {
            if let current, current != account {
                outcome.linkConflict = true  // the new identity is already linked elsewhere: kept, reported
            } else if current == nil {
                if let from = record.from, oldAccount != nil { _ = try await store.unlink(from, on: loop).get() }
                do {
                    switch try await store.link(sub, to: account, on: loop).get() {
                    case .linked: outcome.account = account
                    case .conflict: outcome.linkConflict = true
                    }
                } catch {
                    // Put the old link back rather than lose it (it moves at the next attempt).
                    if let from = record.from, oldAccount != nil { _ = try? await store.link(from, to: account, on: loop).get() }
                    throw error
                }
            } else {
                outcome.account = account
            }
        }
        if let from = record.from {
            // The old sessions' refresh tokens belong to the old team: they end, and the old
            // identity's profile and tokens go with them.
            outcome.sessionsEnded = try await store.revoke(from, at: t, keep: keep, forget: .everything, end: .transferred, on: loop).get().ended
        }
        // The mapping drops the exported line (name, email, link): the profile holds it now.
        try await store.putTransfer(TransferRecord(id: record.id, to: sub, mappedAt: t), on: loop).get()
        return outcome
    }
}

extension Optional {
    fileprivate func asyncMap<T>(_ transform: (Wrapped) async throws -> T) async rethrows -> T? {
        switch self {
        case .some(let value): return try await transform(value)
        case .none: return nil
        }
    }
}
