package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// deductScript is the classic Redis pre-deduction: check and decrement in
// one Lua call, with the request id recorded so a repeat answers the same.
// Returns 1 for a win, 2 for a repeat of a win, 0 for sold out.
const deductScript = `
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then return 2 end
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
local q = tonumber(ARGV[1])
if n < q then return 0 end
redis.call('DECRBY', KEYS[1], q)
redis.call('INCRBY', KEYS[3], q)
redis.call('HSET', KEYS[2], ARGV[2], q)
return 1`

type redisStrategy struct {
	noHolds
	rdb        *redis.Client
	script     *redis.Script
	sc         *Scenario
	durability string
	// wait, when above 0, follows every deduct with WAIT wait (in the same
	// round trip): its answer counts only once that many replicas hold it.
	wait int
	pids []int // the Redis processes (-redis-pids), for their CPU
}

// redisWaitTimeout bounds a WAIT: a write fewer replicas acknowledged in
// that time counts as an error, not a sale.
const redisWaitTimeout = 5 * time.Second

func newRedis(ctx context.Context, o *Options) (*redisStrategy, error) {
	addr, conns := o.Redis, o.Conns
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: conns, MinIdleConns: conns})
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("redis at %s: %w", addr, err)
	}
	durability := "AOF off (no durability)"
	if on, err := rdb.ConfigGet(ctx, "appendonly").Result(); err == nil && on["appendonly"] == "yes" {
		fsync, _ := rdb.ConfigGet(ctx, "appendfsync").Result()
		durability = "AOF appendfsync " + fsync["appendfsync"]
	}
	if o.RedisWait > 0 {
		durability += fmt.Sprintf(", WAIT %d", o.RedisWait)
	}
	return &redisStrategy{rdb: rdb, script: redis.NewScript(deductScript), durability: durability, wait: o.RedisWait, pids: o.RedisPIDs}, nil
}

func (r *redisStrategy) serverPIDs() []int { return r.pids }

func (r *redisStrategy) Name() string                { return "redis-lua" }
func (r *redisStrategy) Durability() string          { return r.durability }
func (r *redisStrategy) Supports(s *Scenario) string { return supportsNoHolds(s) }
func (r *redisStrategy) Close() error                { return r.rdb.Close() }

func redisKeys(sku string) []string {
	return []string{"stock:{" + sku + "}", "orders:{" + sku + "}", "sold:{" + sku + "}"}
}

func (r *redisStrategy) Setup(ctx context.Context, s *Scenario) error {
	r.sc = s
	for k, sku := range s.SKUs {
		keys := redisKeys(sku)
		if err := r.rdb.Del(ctx, keys...).Err(); err != nil {
			return err
		}
		if err := r.rdb.Set(ctx, keys[0], s.Units[k], 0).Err(); err != nil {
			return err
		}
	}
	return r.script.Load(ctx, r.rdb).Err()
}

func (r *redisStrategy) Deduct(ctx context.Context, _ int, req *Request) Outcome {
	keys := redisKeys(r.sc.SKUs[req.SKU])
	var res int
	var err error
	if r.wait > 0 {
		// The script was loaded by Setup: EVALSHA and WAIT go together,
		// one round trip, as a client that wants replicated writes sends
		// them.
		pipe := r.rdb.Pipeline()
		call := r.script.EvalSha(ctx, pipe, keys, req.Qty, req.RequestID)
		acks := pipe.Do(ctx, "WAIT", r.wait, redisWaitTimeout.Milliseconds())
		if _, err = pipe.Exec(ctx); err == nil {
			res, err = call.Int()
		}
		if n, werr := acks.Int64(); err == nil && (werr != nil || n < int64(r.wait)) {
			err = fmt.Errorf("WAIT %d: %d replicas acknowledged the write (%v)", r.wait, n, werr)
		}
	} else {
		res, err = r.script.Run(ctx, r.rdb, keys, req.Qty, req.RequestID).Int()
	}
	if err != nil {
		return Outcome{Err: err}
	}
	if res == 0 {
		return Outcome{Reason: "sold_out"}
	}
	return Outcome{Win: true, OrderID: req.RequestID}
}

func (r *redisStrategy) Remaining(ctx context.Context) (int64, error) {
	var n int64
	for _, sku := range r.sc.SKUs {
		v, err := r.rdb.Get(ctx, redisKeys(sku)[0]).Int64()
		if err != nil {
			return 0, err
		}
		n += v
	}
	return n, nil
}

func (r *redisStrategy) Final(ctx context.Context) (Final, error) {
	f := Final{Valid: true}
	for k, sku := range r.sc.SKUs {
		keys := redisKeys(sku)
		left, err := r.rdb.Get(ctx, keys[0]).Int64()
		if err != nil {
			return f, err
		}
		sold, err := r.rdb.Get(ctx, keys[2]).Int64()
		if err != nil && err != redis.Nil {
			return f, err
		}
		f.Remaining += left
		f.Sold += sold
		if left < 0 || left+sold != r.sc.Units[k] {
			f.Valid = false
			f.Detail += fmt.Sprintf("%s: left %d + sold %d != %d; ", sku, left, sold, r.sc.Units[k])
		}
	}
	return f, nil
}
