/// What `migrate import` did.
public struct ImportReport: Sendable, Equatable {
    public var moved = 0
    /// Lines an earlier run (or the user's sign-in) already mapped.
    public var alreadyMapped = 0
    /// Apple refused the transfer id (`invalid_request`: consent revoked, wrong team, or outside
    /// the 60-day transfer period): users left behind; running again does not move them.
    public var refused: [String] = []
    /// The linked account of each refused transfer id that had one (so the operator knows who).
    public var refusedAccounts: [String: String] = [:]
    /// Apple or the store did not answer after retries: run the import again (or the user is
    /// mapped at their next sign-in).
    public var failed: [String] = []
    public var sessionsEnded = 0
    public var linksMoved = 0
    /// Transfer ids whose account is already linked to another identity here: not linked.
    public var linkConflicts: [String] = []
    /// Route name → the users (new `sub`s) its `allow.users` should name, with the entry they
    /// replace when this store knew it.
    public var allowListChanges: [String: [AllowListChange]] = [:]
    public var appleCalls = 0
}

public struct AllowListChange: Sendable, Equatable {
    public var sub: String
    /// The sending team's `sub` the config may still name (then it keeps matching until replaced).
    public var replaces: String?
}

extension ImportReport {
    /// `migrate import`'s exit status: 0 when every line is mapped; 2 while some are not yet
    /// (Apple or the store did not answer: run again); else 3 when Apple refused some (users
    /// left behind, listed). 2 wins over 3: a script that runs the import again while it exits
    /// 2 then stops at 3 with the final list.
    public var exitStatus: Int32 { !failed.isEmpty ? 2 : !refused.isEmpty ? 3 : 0 }

    /// What the operator reads, with the `allow.users` entries to put in the configuration.
    public var summary: [String] {
        var lines = ["moved \(moved) user\(moved == 1 ? "" : "s") (\(sessionsEnded) old session\(sessionsEnded == 1 ? "" : "s") ended, \(linksMoved) link\(linksMoved == 1 ? "" : "s") moved)"
                     + (alreadyMapped > 0 ? "; \(alreadyMapped) already mapped" : "") + "; \(appleCalls) call\(appleCalls == 1 ? "" : "s") to Apple"]
        if !linkConflicts.isEmpty {
            lines.append("\(linkConflicts.count) not linked: the account is linked to another Apple identity here (transfer ids: \(linkConflicts.joined(separator: " ")))")
        }
        if !refused.isEmpty {
            lines.append("\(refused.count) user\(refused.count == 1 ? "" : "s") left behind: Apple refused the transfer id (consent revoked, another team's id, or outside the 60-day transfer period); running again will not move \(refused.count == 1 ? "it" : "them"):")
            for id in refused { lines.append("  - \(id) left behind" + (refusedAccounts[id].map { " (account \($0))" } ?? "")) }
        }
        if !failed.isEmpty {
            lines.append("\(failed.count) not mapped yet (Apple or the store did not answer): run the same command again; meanwhile each is mapped at their next sign-in")
        }
        for route in allowListChanges.keys.sorted() {
            lines.append("routes[\(route)].allow.users should name:")
            for change in allowListChanges[route]! {
                lines.append("  - \"\(change.sub)\"" + (change.replaces.map { "   # replaces \"\($0)\" (which keeps matching this user until you replace it)" } ?? ""))
            }
        }
        return lines
    }
}
