package raftfsm

import (
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/stock"
)

// This package's tests name the commands unqualified, as the ledger did
// before they had a package of their own.

type (
	Op            = command.Op
	Command       = command.Command
	CreateSale    = command.CreateSale
	Restock       = command.Restock
	Lease         = command.Lease
	Return        = command.Return
	Take          = command.Take
	Confirm       = command.Confirm
	Release       = command.Release
	Reclaim       = command.Reclaim
	Register      = command.Register
	Expire        = command.Expire
	PruneRequests = command.PruneRequests
	AckConsumer   = command.AckConsumer
	PruneEvents   = command.PruneEvents
	CloseSale     = command.CloseSale
	ArchiveSale   = command.ArchiveSale
	PurgeArchived = command.PurgeArchived
	PurgeOrders   = command.PurgeOrders
	SaleConfig    = stock.SaleConfig
	TakeEntry     = command.TakeEntry
	Enter         = command.Enter
	EnterEntry    = command.EnterEntry
	Draw          = command.Draw
	SetRules      = command.SetRules
	Cursor        = stock.Cursor
	legacyCommand = command.Legacy
)

const (
	OpCreateSale    = command.OpCreateSale
	OpRestock       = command.OpRestock
	OpLease         = command.OpLease
	OpReturn        = command.OpReturn
	OpTake          = command.OpTake
	OpConfirm       = command.OpConfirm
	OpRelease       = command.OpRelease
	OpReclaim       = command.OpReclaim
	OpRegister      = command.OpRegister
	OpExpire        = command.OpExpire
	OpPruneRequests = command.OpPruneRequests
	OpAckConsumer   = command.OpAckConsumer
	OpPruneEvents   = command.OpPruneEvents
	OpCloseSale     = command.OpCloseSale
	OpArchiveSale   = command.OpArchiveSale
	OpPurgeArchived = command.OpPurgeArchived
	OpEnter         = command.OpEnter
	OpDraw          = command.OpDraw
	OpSetRules      = command.OpSetRules
	OpPurgeOrders   = command.OpPurgeOrders
	PurgeOrdersMax  = command.PurgeOrdersMax
	SaleModeLottery = stock.SaleModeLottery
	EnterHeaderSize = command.EnterHeaderSize
)

var (
	EncodeCommand  = command.EncodeCommand
	DecodeCommand  = command.DecodeCommand
	ParseCursor    = stock.ParseCursor
	ErrBadCursor   = stock.ErrBadCursor
	TakeHeaderSize = command.TakeHeaderSize
)
