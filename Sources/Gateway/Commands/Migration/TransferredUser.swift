/// A user an app transfer moved to their `sub` at the recipient team, as the app is told
/// (`user.transferred`): by `migrate import`, or at their first sign-in at the recipient.
public struct TransferredUser: Sendable, Equatable {
    /// The user's `sub` here (the recipient team's).
    public var sub: String
    /// Their `sub` at the sending team, when this store knew it (the same operator on both
    /// sides); another operator's import never learns it (the file names no sub, TN3159).
    public var formerSub: String?
    /// Apple's transfer id: the key the sending team's data export names the user by.
    public var transferSubject: String

    public init(sub: String, formerSub: String?, transferSubject: String) {
        self.sub = sub
        self.formerSub = formerSub
        self.transferSubject = transferSubject
    }
}
